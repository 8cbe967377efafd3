"""Who may call what on the extender's TLS port, by the subject of the client certificate.

Mutual TLS only says that `--client-ca-file` signed the caller's certificate. A CA made for the
extender may sign more than kube-scheduler's certificate (an operator's, for `sharepack explain`),
and /bind acts with the extender's cluster-wide `pods/binding`: so the verbs answer only the
scheduler's common names (`--scheduler-client-cn`, kube-scheduler by default) and the read-only
/explain only its own (`--explain-client-cn`, sharepack-explain by default), so that a
certificate handed to an operator cannot bind pods. The probes and /metrics, which the plain
`--metrics-listen` port serves to anyone its NetworkPolicy admits, answer any certificate the CA
signed. Anything else is refused with 403 naming the certificate's subject and who may call it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER_CNS: tuple[str, ...] = ("kube-scheduler",)  # docs/install.md's client certificate
DEFAULT_EXPLAIN_CNS: tuple[str, ...] = ("sharepack-explain",)
VERBS = ("filter", "prioritize", "bind")
READ_ONLY = ("explain",)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def subject(peercert: Any) -> str:
    """The certificate's subject, in its own order: `O=b,CN=a`."""
    if not isinstance(peercert, dict):
        return ""
    parts = []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
                     "countryName": "C"}.get(key, key)  # fmt: skip
            parts.append(f"{short}={value}")
    return ",".join(parts)


def common_names(peercert: Any) -> list[str]:
    if not isinstance(peercert, dict):
        return []
    return [value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"]


@dataclass(frozen=True, slots=True)
class Authorizer:
    scheduler_cns: frozenset[str]
    explain_cns: frozenset[str]
    url_prefix: str = ""  # the Extender's, normalized: "" or "/x"

    def allowed(self, path: str) -> tuple[frozenset[str], str] | None:
        """The common names that may call `path` and the flag that names them; None: any
        client the CA certified (probes, /metrics, and the router's 404 for the rest)."""
        p = self.url_prefix
        if not path.startswith(p + "/"):
            return None
        name = path[len(p) + 1 :]
        if name in VERBS:
            return self.scheduler_cns, "--scheduler-client-cn"
        if name in READ_ONLY:
            return self.explain_cns, "--explain-client-cn"
        return None

    def decide(self, path: str, peercert: Any) -> str | None:
        """None when the caller may call `path`, else the 403's text."""
        rule = self.allowed(path)
        if rule is None:
            return None
        may, flag = rule
        if any(n in may for n in common_names(peercert)):
            return None
        who = subject(peercert) or "(none)"
        return (f"forbidden: client certificate subject {who!r} may not call {path}: it answers "
                f"CN {', '.join(sorted(may)) or '(no one)'} ({flag})\n")  # fmt: skip

    def check(self, route: str, peercert: Any, path: str) -> str | None:
        """`decide` for a request to `route` (spelt `path` by the caller), logging a refusal."""
        refusal = self.decide(route, peercert)
        if refusal is not None:
            log.warning("%s", refusal.rstrip(), extra={"path": path, "subject": subject(peercert)})
        return refusal

    def middleware(self) -> Middleware:
        """For the mutual-TLS port only (the handshake has checked the certificate's CA)."""

        @web.middleware
        async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
            # Judge the route the router matched, not the request's spelling of the path: what
            # runs is the handler of that route, however the path was written.
            resource = request.match_info.route.resource
            if resource is None:
                return await handler(request)  # no route: the router's own 404 or 405
            transport = request.transport
            peercert = transport.get_extra_info("peercert") if transport is not None else None
            refusal = self.check(resource.canonical, peercert, request.path)
            if refusal is not None:
                return web.Response(status=403, text=refusal)
            return await handler(request)

        return authorize
