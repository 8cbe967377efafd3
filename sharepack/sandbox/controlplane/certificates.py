"""Certificates for mutual TLS between the scheduler (the sandbox driver or the real
kube-scheduler) and the extender: the extender's serving certificate, a client certificate for
the scheduler and one for `sharepack explain`, all from one CA (`sandbox.pki.Authority`), as
PEM files in one directory.

docs/install.md does the same with openssl for a real cluster. The serving certificate names
127.0.0.1, ::1 and localhost (the sandbox dials those) and is for serving only; the client ones
are for logging in only, and their common names are what the extender authorizes
(extender.authorizing: the scheduler's for the verbs, the other for /explain alone).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sharepack.sandbox.controlplane import pki

SERVER_HOSTS: tuple[str, ...] = ("127.0.0.1", "::1", "localhost")
CLIENT_NAME = "kube-scheduler"  # the extender's --scheduler-client-cn default
EXPLAIN_CLIENT_NAME = "sharepack-explain"  # its --explain-client-cn default


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path  # the scheduler's
    client_key: Path
    explain_cert: Path  # `sharepack explain`'s: /explain only
    explain_key: Path

    def extender_args(self) -> list[str]:
        """The extender's flags that serve mutual TLS with these files."""
        return [
            f"--tls-cert-file={self.server_cert}",
            f"--tls-private-key-file={self.server_key}",
            f"--client-ca-file={self.ca_cert}",
        ]

    def client_context(self) -> ssl.SSLContext:
        """What a scheduler presents: the client certificate, trusting only this CA."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_cert))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def scheduler_tls_config(self) -> dict[str, str]:
        """kube-scheduler's extender `tlsConfig` (v1 KubeSchedulerConfiguration) for these files."""
        return {"certFile": str(self.client_cert), "keyFile": str(self.client_key), "caFile": str(self.ca_cert)}


def extender_tls(authority: pki.Authority, *, hosts: Sequence[str] = SERVER_HOSTS) -> TlsFiles:
    """A serving certificate for the extender and client certificates for the scheduler and for
    `sharepack explain`, all from `authority`, written next to its CA."""
    server = authority.issue("extender-server", "sharepack-extender", hosts=tuple(hosts), client=False, server=True)
    client = authority.issue("extender-client", CLIENT_NAME)
    explain = authority.issue("explain-client", EXPLAIN_CLIENT_NAME)
    return TlsFiles(authority.ca.cert, server.cert, server.key, client.cert, client.key, explain.cert, explain.key)


def write_tls_files(directory: Path, *, ca_name: str = "sharepack-extender-ca") -> TlsFiles:
    """`extender_tls` from a fresh CA of its own in `directory`."""
    return extender_tls(pki.Authority(directory, ca_name))
