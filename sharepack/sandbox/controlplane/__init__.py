"""The real control plane: etcd, kube-apiserver and kube-scheduler built from their Go modules
(`kubebuild`, the module in `kube/`), started on loopback (`plane`) with a throwaway CA (`pki`),
the identities sharepack's processes have in a cluster (`identities`) and the extender's mTLS
files (`certificates`).
"""
