"""The Allocate log on disk survives the agent (agent.allocationlog): what a restarted agent
knows about devices it allocated before, finished init containers' included."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sharepack.agent import allocationlog
from sharepack.agent.allocationlog import AllocationLog
from tests.agent.harness import config, fake_kubelet, plain_gpus, running_agent, time_slicing
from sharepack.sandbox.kubelet.pods import ContainerSpec, PodSpec


def test_entries_survive_a_new_reader_oldest_first(tmp_path: Path) -> None:
    path = allocationlog.path_beside(tmp_path)
    first = AllocationLog(path, keep=10)
    first.append("r", ["a::0", "a::1"], 100.0, [])
    first.append("r", ["b::0"], 101.5, [])
    assert AllocationLog(path, keep=10).load() == [("r", ("a::0", "a::1"), 100.0), ("r", ("b::0",), 101.5)]


def test_the_file_is_rewritten_from_the_kept_entries_when_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = AllocationLog(path, keep=2)
    kept: list[allocationlog.Entry] = []
    for i in range(7):
        kept = [*kept, ("r", (f"d{i}",), float(i))][-2:]
        log.append("r", [f"d{i}"], float(i), kept)
    assert len(path.read_bytes().splitlines()) <= 4
    assert AllocationLog(path, keep=2).load() == [("r", ("d5",), 5.0), ("r", ("d6",), 6.0)]


def test_unreadable_lines_are_skipped_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "log"
    path.write_bytes(b'{"r": "r", "d": ["x"], "t": 1}\nnot json\n{"r": "r"}\n')
    assert AllocationLog(path, keep=10).load() == [("r", ("x",), 1.0)]
    assert "skipped 2 unreadable line(s)" in caplog.text


def test_an_unwritable_place_turns_the_log_off_without_failing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    (tmp_path / allocationlog.DIRECTORY).write_text("a file where the directory should be")
    log = AllocationLog(allocationlog.path_beside(tmp_path), keep=10)
    log.append("r", ["x"], 1.0, [])
    log.append("r", ["y"], 2.0, [])  # said once, then quiet
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"cannot write the allocation log {allocationlog.path_beside(tmp_path)}"
    ]


async def test_a_restarted_agent_knows_what_its_previous_life_allocated() -> None:
    cfg = config(time_slicing(4))
    init_pod = PodSpec(
        uid="u1", name="with-init",
        containers=(ContainerSpec("app", {"nvidia.com/gpu": 1}),),
        init_containers=(ContainerSpec("init", {"nvidia.com/gpu": 3}),),
    )  # fmt: skip
    async with fake_kubelet() as kubelet:
        async with running_agent(kubelet, cfg, plain_gpus(2)) as first:
            await kubelet.admit_pod(init_pod)
            before = first.snapshot().allocations
        admitted = kubelet.admission("u1")
        assert sorted(tuple(sorted(a.device_ids)) for a in before) == sorted(
            tuple(sorted(admitted.devices(c, "nvidia.com/gpu"))) for c in ("init", "app")
        )
        assert len(before[0].device_ids) == 3  # the init container's: no later PodResources shows them
        async with running_agent(kubelet, cfg, plain_gpus(2)) as second:
            after = second.snapshot().allocations
            assert [(a.resource, a.device_ids, a.wall) for a in after] == [
                (a.resource, a.device_ids, a.wall) for a in before
            ]
            # Monotonic times are rebuilt from the wall-clock gaps: the order and spacing hold.
            assert after[1].at - after[0].at == pytest.approx(before[1].wall - before[0].wall)
