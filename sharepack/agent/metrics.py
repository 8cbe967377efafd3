"""The agent's Prometheus metrics: one `AgentMetrics` per process, in a registry of its own.

The agent serves them at `/metrics` (agent.monitoring). The names are an interface: the docs,
deploy/grafana/sharepack.json and tests/agent/test_monitoring.py use them.

Adding a metric: declare it in `AgentMetrics.__init__` on `registry=r`, named
`sharepack_agent_<what>` (counters without `_total`: the library adds it), with a help text that
says what one unit is; give labels a fixed, small set of values and create the children of the
values known up front (so they show 0 instead of being absent). Code that counts gets the
`AgentMetrics` object passed in (the Agent owns it as `agent.metrics`), never a global.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# A `_created` series per counter and histogram doubles what Prometheus stores and says nothing
# a restart-aware rate() does not; process-wide, so set once here.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

# gRPC calls from the kubelet: answered in well under a millisecond unless something is wrong.
RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# From a change the agent notices to its NodeGpuState write: debounce + rate limit, ~0.2-1 s.
PUBLISH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

SUCCESS = "success"
FAILURE = "failure"
REJECTED = "rejected"  # a request the agent refuses (bad device IDs, more than one replica, ...)
ERROR = "error"  # a bug or a failure of ours
HONOURED = "honoured"  # a directed allocation answered as directed
TOPOLOGY = "topology"  # the `policy` label of full GPUs: they take the topology-aware path


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.allocations = Counter(
            "sharepack_agent_allocations",
            "Containers the agent answered Allocate for, by resource, the policy that chose the "
            "devices (topology for full GPUs) and outcome (success, rejected, error).",
            ["resource", "policy", "outcome"], registry=r,
        )  # fmt: skip
        self.preferred_seconds = Histogram(
            "sharepack_agent_get_preferred_allocation_duration_seconds",
            "Time to answer one GetPreferredAllocation call, by resource.",
            ["resource"], buckets=RPC_BUCKETS, registry=r,
        )  # fmt: skip
        self.allocate_seconds = Histogram(
            "sharepack_agent_allocate_duration_seconds",
            "Time to answer one Allocate call, by resource.",
            ["resource"], buckets=RPC_BUCKETS, registry=r,
        )  # fmt: skip
        self.unhealthy = Gauge(
            "sharepack_agent_unhealthy_devices",
            "Devices the agent reports unhealthy to the kubelet, by resource.",
            ["resource"], registry=r,
        )  # fmt: skip
        self.xids = Counter(
            "sharepack_agent_xids",
            "NVML XID events, by code and whether they count against the device (critical).",
            ["code", "critical"], registry=r,
        )  # fmt: skip
        self.kubelet_restarts = Counter(
            "sharepack_agent_kubelet_restarts",
            "Kubelet restarts noticed (kubelet.sock re-created or a plugin socket removed).",
            registry=r,
        )
        self.registrations = Counter(
            "sharepack_agent_registrations",
            "Register calls to the kubelet, by resource and outcome (success, failure).",
            ["resource", "outcome"], registry=r,
        )  # fmt: skip
        self.registered = Gauge(
            "sharepack_agent_registered",
            "1 while a resource is registered with the kubelet since its server last started.",
            ["resource"], registry=r,
        )  # fmt: skip
        self.state_writes = Counter(
            "sharepack_agent_state_writes", "NodeGpuState status writes that the API accepted.", registry=r
        )
        self.state_write_errors = Counter(
            "sharepack_agent_state_write_errors",
            "NodeGpuState writes that failed (each is retried with back-off).", registry=r,
        )  # fmt: skip
        self.state_publish_delay = Histogram(
            "sharepack_agent_state_publish_delay_seconds",
            "Seconds from a change the agent noticed (a pod's devices, an allocation, health) to "
            "the NodeGpuState write that publishes it.",
            buckets=PUBLISH_BUCKETS, registry=r,
        )  # fmt: skip
        self.config_reloads = Counter(
            "sharepack_agent_config_reloads",
            "Config reloads, by source (sighup; configmap: the named per-node config, live) and "
            "outcome (success, failure; a failure keeps the config in use).",
            ["source", "outcome"], registry=r,
        )  # fmt: skip
        for source in ("sighup", "configmap"):
            for outcome in (SUCCESS, FAILURE):
                self.config_reloads.labels(source, outcome)
        self.directed = Counter(
            "sharepack_agent_directed_allocations",
            "GetPreferredAllocation answers for pods the extender directed (annotation sharepack.io/gpus), "
            "by outcome: honoured, or the reason the node's policy chose instead (agent.directing.Fallback).",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.directed.labels(HONOURED)

    def value(self, name: str, **labels: str) -> float:
        """One sample's value (0 when absent): for tests and logs."""
        return self.registry.get_sample_value(name, labels) or 0.0
