"""A cluster in a box, for the demo, the soak, the replays and the end-to-end tests.

* `apiserver/`: the in-process Kubernetes API server (the no-Go default).
* `kubelet/`: the sandbox kubelet and the simulated GPU nodes (one process per node, or a fleet).
* `controlplane/`: the real kube-apiserver, etcd and kube-scheduler, built and started here.
* `drivers/`: demo, chaos soak, trace replay, scale cluster (scenarios over the parts above).
* `scheduling`, `apiwatch`, `tcpproxy`, `processes`: the in-process scheduler, the sandbox's
  list+watch client, a Service-like TCP proxy and child processes, shared by the parts above.
"""
