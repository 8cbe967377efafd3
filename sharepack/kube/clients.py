"""An asyncio API client (`kubernetes.aio`) with the same server and credentials as a blocking
one, for a process that holds a blocking client (the extender binds pods with it) and watches
through the reflector, which needs the aio client.

The credential refresh hook is shared too: an in-cluster service-account token, which the
kubelet rotates, or an exec/OIDC kubeconfig keeps working for both clients.
"""

from __future__ import annotations

from typing import Any

from kubernetes.aio import client as aio_client

# What a kubernetes.client.Configuration carries that says where the server is and who we are.
_CONNECTION = (
    "host", "api_key", "api_key_prefix", "refresh_api_key_hook", "username", "password",
    "ssl_ca_cert", "cert_file", "key_file", "verify_ssl", "tls_server_name", "proxy", "proxy_headers",
)  # fmt: skip


def aio_client_like(api: Any) -> aio_client.ApiClient:
    """An aio ApiClient for the server and credentials of blocking `api` (close it when done)."""
    configuration = aio_client.Configuration()
    for name in _CONNECTION:
        setattr(configuration, name, getattr(api.configuration, name))
    configuration.api_key = dict(api.configuration.api_key)  # each refresh writes its own copy
    return aio_client.ApiClient(configuration=configuration)
