"""The sandbox kubelet: what a node's kubelet does for device plugins and the API server, over the
real protocols (`devicemanager`: registration, ListAndWatch, admission; `api`: the Node, its
status and its pods; `podresources`: the PodResources server), plus the simulated nodes built on it
(`nodes`: kubelet + the real agent as a child process; `fleet`: thousands of nodes in one process).
"""
