"""sharepack: GPU-sharing placement for Kubernetes.

One import package for the whole project: `sharepack.agent` (the node agent), `sharepack.extender`
(the scheduler extender), `sharepack.common` (the pure core), `sharepack.kube`, `sharepack.cli`,
`sharepack.proto`, `sharepack.tracesim` and `sharepack.sandbox`.
"""
