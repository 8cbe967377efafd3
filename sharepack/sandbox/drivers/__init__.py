"""Scenarios composed from the sandbox's parts: the demo, the chaos soak, the trace replay through
the real kube-scheduler and the scale cluster; they hold scenarios, not mechanisms.
"""
