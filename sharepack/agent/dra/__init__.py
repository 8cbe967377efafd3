"""The agent as a DRA kubelet plugin (`sharepack-agent --mode dra`): plugin registration, the
kubelet's DRA gRPC service, CDI specs for prepared claims, and the node's ResourceSlices."""
