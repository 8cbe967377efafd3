"""The in-process Kubernetes API server: the quick, no-Go stand-in for kube-apiserver, driven by
the real `kubernetes` client and kubectl. `server` serves; the other modules are the parts of the
real server's behaviour it reproduces (storage and watches, defaults, patching, tables, OpenAPI).
"""
