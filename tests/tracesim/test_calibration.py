"""The calibration gate, in the suite: the default trace against the study's cached results.

One seed per fast baseline, pinned (about a second), fails when a change to the replay (arrival
order, tuning, filter, GPU choice, binning) moves a figure the README's calibration table was
measured with; the gate itself (Random, BestFit and FGD within 0.3 points of the study) on three
seeds, so CI checks the calibration and not only our own past. `benchmarks/bench_tracesim.py`
runs the full ten-seed gate.
"""

from __future__ import annotations

import pytest

from sharepack.tracesim import policies, reporting, running, traces

# Seed 42 of our replay; the study's ten-seed means for comparison (README calibration table).
PINNED = {"random": (13.40, 12.26), "bestfit": (6.95, 6.71)}
PUBLISHED_100 = {"random": 13.70, "bestfit": 7.14}


@pytest.fixture(scope="module")
def experiment() -> running.Experiment:
    return running.Experiment.build(traces.load_pods(), traces.load_nodes())


@pytest.mark.parametrize("name", list(PINNED))
def test_seed_42_of_the_default_trace_reproduces_the_calibrated_figures(
    experiment: running.Experiment, name: str
) -> None:
    run = experiment.run(policies.resolve(name), running.FIRST_SEED)
    at_100, at_130 = PINNED[name]
    assert run.binned.unallocated(100) == pytest.approx(at_100, abs=0.005)
    assert run.binned.unallocated(130) == pytest.approx(at_130, abs=0.005)
    # One seed is within a seed's spread of the study's mean, not just of our own past.
    assert abs(run.binned.unallocated(100) - PUBLISHED_100[name]) < 0.5
    published = reporting.load_published(traces.workload_name(experiment.pods))
    assert 100 - published[name][100] == pytest.approx(PUBLISHED_100[name], abs=0.01)


# The gate of benchmarks/bench_tracesim.py on three seeds (42-44), so CI runs it: the mean of
# three seeds is within the gate of the study's ten-seed mean, and pinned.
GATE = 0.3
THREE_SEEDS = {"random": 13.7100, "bestfit": 7.2567, "fgd": 4.7267}


@pytest.mark.slow
@pytest.mark.timeout(600)  # about 25 s on an idle machine, FGD most of it
@pytest.mark.parametrize("name", list(THREE_SEEDS))
def test_the_calibration_gate_holds_on_three_seeds(experiment: running.Experiment, name: str) -> None:
    runs = [experiment.run(policies.resolve(name), seed) for seed in (42, 43, 44)]
    mean = sum(r.binned.unallocated(100) for r in runs) / len(runs)
    published = reporting.load_published(traces.workload_name(experiment.pods))
    assert abs(mean - (100 - published[name][100])) <= GATE
    assert mean == pytest.approx(THREE_SEEDS[name], abs=0.005)
