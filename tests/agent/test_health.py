"""XID policy (upstream's env semantics), which devices an XID hits, and recovery."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sharepack.agent.health import APPLICATION_XIDS, HealthBook, XidPolicy, affected_devices, parse_xids


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", set(), id="empty is nothing"),
        pytest.param(",", set(), id="a lone comma is nothing"),
        pytest.param("not-an-int", set(), id="words are skipped"),
        pytest.param("-68", set(), id="negative numbers are skipped"),
        pytest.param("68  ", {68}, id="spaces are trimmed"),
        pytest.param(",68", {68}, id="leading comma is fine"),
        pytest.param("68,not-an-int,67", {67, 68}, id="bad entries do not spoil good ones"),
        pytest.param("\u0663", set(), id="non-ascii digits are skipped"),
    ],
)
def test_parse_xids_like_upstream(text: str, expected: set[int]) -> None:
    assert parse_xids(text) == expected


@pytest.mark.parametrize(
    ("disable", "enable", "critical", "ignored", "checks_off"),
    [
        pytest.param("", "", {79, 48, 555}, set(APPLICATION_XIDS), False, id="defaults ignore application xids"),
        pytest.param("all", "", set(), {79, 13, 555}, True, id="disable all switches checks off"),
        pytest.param("xids", "", set(), {79}, True, id="disable xids switches checks off"),
        pytest.param("79,48", "", {555}, {79, 48, 13}, False, id="disable a list adds to the ignored"),
        pytest.param("", "all", {13, 31, 79, 555}, set(), False, id="enable all counts every xid"),
        pytest.param("11", "11", {11, 79}, {13}, False, id="enable overrides disable"),
        pytest.param("all", "79", {79}, {48, 13}, False, id="enable single xids under disable all"),
        pytest.param("", "13", {13, 79}, {31}, False, id="enable an application xid"),
        pytest.param("48, all", "", set(), {79, 555}, True, id="disable all anywhere in a list switches checks off"),
        pytest.param("XIDS", "", set(), {79}, True, id="disable tokens are case-insensitive"),
        pytest.param("noxids", "", {79}, {13}, False, id="a word merely containing xids is not a token"),
        pytest.param("", "xids", {13, 31, 555}, set(), False, id="enable xids counts every xid"),
        pytest.param("all", "79,all", {13, 48}, set(), False, id="enable all anywhere in a list counts every xid"),
    ],
)
def test_xid_policy_from_env(
    disable: str, enable: str, critical: set[int], ignored: set[int], checks_off: bool
) -> None:
    policy = XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": disable, "DP_ENABLE_HEALTHCHECKS": enable})
    assert {x for x in critical if policy.is_critical(x)} == critical
    assert {x for x in ignored if not policy.is_critical(x)} == ignored
    assert policy.checks_off is checks_off


@dataclass(frozen=True)
class _Dev:
    id: str
    uuid: str
    physical_key: str


@dataclass(frozen=True)
class _Res:
    devices: tuple[_Dev, ...]


@dataclass(frozen=True)
class _Xid:
    uuid: str
    xid: int = 79
    mig_gi: int | None = None
    mig_ci: int | None = None


SHARED = _Res(tuple(_Dev(f"GPU-a::{n}", "GPU-a", "GPU-a") for n in range(3)) + (_Dev("GPU-b::0", "GPU-b", "GPU-b"),))
MIG = _Res((_Dev("MIG-1", "MIG-1", "GPU-c"), _Dev("MIG-2", "MIG-2", "GPU-c"), _Dev("MIG-3", "MIG-3", "GPU-d")))
INSTANCES = {"MIG-1": (1, 0), "MIG-2": (2, 0), "MIG-3": (1, 0)}


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        pytest.param(_Xid("GPU-a"), {"GPU-a::0", "GPU-a::1", "GPU-a::2"}, id="every replica of the gpu"),
        pytest.param(_Xid("GPU-c", mig_gi=2, mig_ci=0), {"MIG-2"}, id="the matching mig instance only"),
        pytest.param(_Xid("GPU-c"), {"MIG-1", "MIG-2"}, id="a whole-device event hits all instances"),
        pytest.param(_Xid("GPU-c", mig_gi=9, mig_ci=0), set(), id="an unknown instance hits nothing"),
        pytest.param(_Xid("GPU-zz"), set(), id="an unknown gpu hits nothing"),
        pytest.param(
            _Xid(""),
            {d.id for d in SHARED.devices + MIG.devices},
            id="an event naming no gpu hits everything",
        ),
    ],
)
def test_affected_devices(event: _Xid, expected: set[str]) -> None:
    assert affected_devices(event, [SHARED, MIG], INSTANCES) == expected  # type: ignore[list-item]


def test_health_book_marks_once_and_heals_after_quiet_period() -> None:
    book = HealthBook()
    assert book.mark({"a", "b"}, now=10.0) == {"a", "b"}
    assert book.mark({"a"}, now=20.0) == set(), "already unhealthy: not a change"
    assert book.next_recovery(quiet_s=30) == 40.0
    assert book.recover(now=39.0, quiet_s=30) == set()
    assert book.recover(now=40.0, quiet_s=30) == {"b"}
    assert book.unhealthy == {"a"}
    assert book.recover(now=1000.0, quiet_s=0) == set(), "0 means never heal (upstream)"
    book.retain(["b"])
    assert book.unhealthy == set()
