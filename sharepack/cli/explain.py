"""`sharepack explain POD`: each candidate node's filter verdict and score from the extender.

The CLI reads the pod and the cluster's node names with the user's credentials and sends them to
the extender's read-only `POST /explain` as the `ExtenderArgs` kube-scheduler would send to
/filter; the extender answers from the same code as /filter and /prioritize and changes nothing.
It is reached at `--extender-url`, else through the API server's service proxy
(`services/<name>:http/proxy`, RBAC `services/proxy` create), as `kubectl` reaches in-cluster
services. The extender as deploy/ ships it takes only clients with a certificate of its client
CA (mutual TLS), which the service proxy has not: then reach it at `--extender-url
https://...` (for example through `kubectl port-forward`) with `--cert`, `--key` and `--cacert`,
a certificate whose common name the extender admits to /explain (`sharepack-explain` by default,
docs/install.md step 2; the scheduler's own is refused there).

Every node is a candidate here but those whose GPU model the pod's node selector or required
node affinity on `nvidia.com/gpu.product` excludes (`common.gpumodels`): kube-scheduler's
NodeAffinity filter rules those out before the extender sees them, and the answer lists them as
such (filter `affinity`). Its other in-tree filters (taints, other affinities, cpu) are not
replayed.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import kubernetes

from sharepack.cli.errors import ExtenderError
from sharepack.common import gpumodels

EXPLAIN_PATH = "/explain"
TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Extender:
    url: str  # base URL; "" means through the API server's service proxy
    namespace: str
    service: str
    cert: str = ""  # client certificate and key for an extender that requires them (mTLS)
    key: str = ""
    cacert: str = ""  # the CA of the extender's serving certificate

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https"):
            return None
        context = ssl.create_default_context(cafile=self.cacert or None)
        if self.cert:
            context.load_cert_chain(self.cert, self.key or None)
        return context


def by_gpu_model(pod: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The candidate node names (sorted), and an answer entry for each node the pod's GPU-model
    constraint rules out (as kube-scheduler's NodeAffinity filter does, by the node's label)."""
    allowed = gpumodels.pod_models(pod)
    candidates: list[str] = []
    ruled_out: list[dict[str, Any]] = []
    for name in sorted(nodes):
        model = gpumodels.node_model(nodes[name])
        if allowed is None or model in allowed:
            candidates.append(name)
            continue
        reason = (
            f"GPU model {model or '(no ' + gpumodels.PRODUCT_LABEL + ' label)'} not among the pod's "
            f"{', '.join(sorted(allowed)) or 'none'} (its node affinity; kube-scheduler filters the node out)"
        )
        ruled_out.append({"node": name, "knowledge": "", "filter": "affinity", "reason": reason, "score": 0})
    return candidates, ruled_out


def explain_body(pod: dict[str, Any], nodes: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": nodes}).encode()


def _check(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise ExtenderError(f"unexpected answer from {where}: {str(doc)[:200]}")
    return doc


def ask(api: Any, extender: Extender, body: bytes) -> dict[str, Any]:
    if extender.url:
        url = extender.url.rstrip("/") + EXPLAIN_PATH
        req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=extender.ssl_context()) as resp:
                return _check(json.loads(resp.read()), url)
        except urllib.error.HTTPError as e:
            raise ExtenderError(f"extender {url}: {e.code} {e.read().decode(errors='replace').strip()}") from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ExtenderError(f"cannot reach the extender at {url}: {e}") from e
    path = f"/api/v1/namespaces/{extender.namespace}/services/{extender.service}:http/proxy{EXPLAIN_PATH}"
    try:
        method, url, headers, payload, post = api.param_serialize(
            "POST", path, header_params={"Content-Type": "application/json"}, body=json.loads(body),
            auth_settings=["BearerToken"],
        )  # fmt: skip
        resp = api.call_api(method, url, header_params=headers, body=payload, post_params=post, _request_timeout=TIMEOUT_S)
        resp.read()
    except (kubernetes.client.ApiException, OSError, ValueError) as e:
        raise ExtenderError(f"cannot reach the extender through the API server ({path}): {e}") from e
    if not 200 <= resp.status <= 299:
        text = (resp.data or b"").decode(errors="replace").strip()[:200]
        raise ExtenderError(f"extender through the API server ({path}): {resp.status} {text}")
    try:
        return _check(json.loads(resp.data), path)
    except ValueError as e:
        raise ExtenderError(f"unexpected answer from {path}: {e}") from e


def with_pod_facts(answer: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """The extender's answer plus what only the pod itself says: its phase and node."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return {**answer, "phase": status.get("phase", ""), "boundTo": spec.get("nodeName") or ""}


def _order(node: dict[str, Any]) -> tuple[int, int, str]:
    # Survivors first, best score first: the order the scheduler would prefer them in.
    return (0 if node["filter"] == "pass" else 1, -int(node["score"]), str(node["node"]))


def render_text(answer: dict[str, Any]) -> str:
    pod = answer["pod"]
    bound = answer.get("boundTo") or ""
    where = f"bound to {bound}" if bound else (answer.get("phase") or "pending").lower()
    request = ", ".join(f"{r}={n}" for r, n in sorted((answer.get("request") or {}).items()))
    lines = [f"pod {pod['namespace']}/{pod['name']} ({where}) requests {request or 'nothing the extender judges'}"]
    if answer.get("error"):
        lines.append(f"the extender cannot read the pod: {answer['error']}")
    nodes = sorted(answer["nodes"], key=_order)
    if not nodes:
        lines.append("every node passes with score 0: no candidate needs the extender's judgement")
        return "\n".join(lines) + "\n"
    if bound:
        lines.append(f"(* {bound} already counts this pod, so it is judged with the pod on it)")
    name_w = max(len("NODE"), *(len(n["node"]) + (2 if n["node"] == bound else 0) for n in nodes))
    lines.append(f"{'NODE':<{name_w}}  {'FILTER':<12}  SCORE  STATE       REASON")
    for n in nodes:
        mark = " *" if n["node"] == bound else ""
        # kube-scheduler prioritizes only the survivors: a filtered-out node has no score.
        score = str(n["score"]) if n["filter"] == "pass" else "-"
        lines.append(f"{n['node'] + mark:<{name_w}}  {n['filter']:<12}  {score:>5}  {n['knowledge']:<10}  {n['reason']}".rstrip())
    return "\n".join(lines) + "\n"
