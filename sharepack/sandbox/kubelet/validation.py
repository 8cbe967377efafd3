"""What the kubelet checks in a device-plugin `Register` call, and the texts it answers with.

The kubelet accepts exactly the API versions it supports (`v1beta1`) and only *extended*
resource names: names with a domain prefix outside `kubernetes.io/`, not starting with the quota
prefix `requests.`, that stay a valid qualified name once `requests.` is prepended (the form
ResourceQuota uses). The rules follow `IsExtendedResourceName` in the kubelet's core/v1 helper;
the messages are the kubelet's own, because plugins (and our agent) log them verbatim.
"""

from __future__ import annotations

import json
import re

SUPPORTED_VERSIONS: tuple[str, ...] = ("v1beta1",)

_DEFAULT_NAMESPACE_PREFIX = "kubernetes.io/"
_REQUESTS_PREFIX = "requests."
_DNS1123_SUBDOMAIN_MAX = 253
_QUALIFIED_NAME_MAX = 63
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def go_quote(value: str) -> str:
    """Go's `%q` for the strings we meet (double quotes, backslash escapes)."""
    return json.dumps(value, ensure_ascii=False)


def unsupported_version_message(version: str) -> str:
    # Go formats the []string with %q element by element: ["v1beta1"].
    supported = "[" + " ".join(go_quote(v) for v in SUPPORTED_VERSIONS) + "]"
    return (
        f"requested API version {go_quote(version)} is not supported by kubelet. "
        f"Supported version is {supported}"
    )


def invalid_resource_name_message(name: str) -> str:
    return f"the ResourceName {go_quote(name)} is invalid"


def _is_qualified_name(value: str) -> bool:
    parts = value.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2:
        prefix, name = parts
        if not prefix or len(prefix) > _DNS1123_SUBDOMAIN_MAX:
            return False
        if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return False
    else:
        name = parts[0]
    if not name or len(name) > _QUALIFIED_NAME_MAX:
        return False
    return _QUALIFIED_NAME.fullmatch(name) is not None


def is_extended_resource_name(name: str) -> bool:
    # Unprefixed names and anything under *kubernetes.io/ are native resources.
    if "/" not in name or _DEFAULT_NAMESPACE_PREFIX in name:
        return False
    if name.startswith(_REQUESTS_PREFIX):
        return False
    return _is_qualified_name(_REQUESTS_PREFIX + name)


def is_supported_version(version: str) -> bool:
    return version in SUPPORTED_VERSIONS
