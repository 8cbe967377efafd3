"""Beyond the upstream vectors (test_shared_vectors.py): the rules' edges."""

from __future__ import annotations

import pytest

from sharepack.common import requests
from sharepack.common.errors import RequestError

KNOWN = frozenset({"g0::0", "g0::1", "g1::0"})


def test_unknown_device_is_reported_before_the_size_rule() -> None:
    with pytest.raises(RequestError, match="^invalid request: unknown device: nope$"):
        requests.validate_allocate(
            "nvidia.com/gpu", ["g0::0", "nope"], KNOWN,
            replicated=True, fail_requests_greater_than_one=True,
        )


def test_unreplicated_resources_ignore_the_size_rule() -> None:
    requests.validate_allocate(
        "nvidia.com/gpu", ["a", "b"], {"a", "b"},
        replicated=False, fail_requests_greater_than_one=True,
    )


def test_a_single_replica_passes_the_size_rule() -> None:
    requests.validate_allocate(
        "nvidia.com/gpu.shared", ["g1::0"], KNOWN,
        replicated=True, fail_requests_greater_than_one=True,
    )


def test_the_size_rule_counts_every_requested_device() -> None:
    with pytest.raises(RequestError, match="found 3$"):
        requests.validate_allocate(
            "nvidia.com/gpu.shared", sorted(KNOWN), KNOWN,
            replicated=True, fail_requests_greater_than_one=True,
        )
