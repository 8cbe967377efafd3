"""Machine descriptions: a bad file fails with an error naming the file and every bad field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharepack.agent import nvml
from sharepack.agent.nvmlsim import MachineError, load_machine

GOOD_GPU = "{pci_bus_id: '00000000:07:00.0'}"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "machine.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "case, text, field, why",
    [
        ("an unknown product",
         f"name: x\nproduct: NVIDIA A100\ngpus: [{GOOD_GPU}]",
         "product", "unknown product 'NVIDIA A100'"),
        ("a misspelt field",
         "name: x\nproduct: Tesla T4\ngpus: [{pci_bus_id: '00000000:07:00.0', numa: 0}]",
         "gpus[0].numa", "unknown field"),
        ("a bus ID in the wrong format",
         "name: x\nproduct: Tesla T4\ngpus: [{pci_bus_id: '07:00.0'}]",
         "gpus[0].pci_bus_id", "not a PCI bus ID"),
        ("no GPUs", "name: x\nproduct: Tesla T4\ngpus: []", "gpus", "non-empty list"),
        ("a GPU without a product", f"name: x\ngpus: [{GOOD_GPU}]", "gpus[0].product", "missing"),
        ("MIG on a GPU without MIG",
         "name: x\nproduct: Tesla T4\ngpus: [{pci_bus_id: '00000000:07:00.0', mig: {}}]",
         "gpus[0].mig", "Tesla T4 does not support MIG"),
        ("a profile of another GPU",
         "name: x\nproduct: NVIDIA A100-SXM4-40GB\ngpus: [{pci_bus_id: '00000000:07:00.0', "
         "mig: {instances: [{profile: 1g.10gb+me, start: 0}]}}]",
         "gpus[0].mig.instances[0].profile", "'1g.10gb+me' is not a MIG profile"),
        ("an invalid placement",
         "name: x\nproduct: NVIDIA A100-SXM4-40GB\ngpus: [{pci_bus_id: '00000000:07:00.0', "
         "mig: {instances: [{profile: 3g.20gb, start: 2}]}}]",
         "gpus[0].mig.instances[0].start", "2 is not a valid placement for 3g.20gb"),
        ("overlapping instances",
         "name: x\nproduct: NVIDIA A100-SXM4-40GB\ngpus: [{pci_bus_id: '00000000:07:00.0', "
         "mig: {instances: [{profile: 4g.20gb, start: 0}, {profile: 2g.10gb, start: 2}]}}]",
         "gpus[0].mig.instances[1].start", "overlaps instances[0] (4g.20gb)"),
        ("an instance on a taken slice",
         "name: x\nproduct: NVIDIA A100-SXM4-40GB\ngpus: [{pci_bus_id: '00000000:07:00.0', "
         "mig: {instances: [{profile: 4g.20gb, start: 0}, {profile: 1g.10gb, start: 4}, "
         "{profile: 1g.10gb, start: 6}, {profile: 1g.5gb, start: 5}]}}]",
         "gpus[0].mig.instances[3].start", "overlaps instances[1] (1g.10gb)"),
        ("more NVLinks than the chip has",
         f"name: x\nproduct: Tesla V100-SXM2-16GB\ngpus: [{GOOD_GPU}, "
         "{pci_bus_id: '00000000:08:00.0'}]\nnvlinks: [{gpus: [0, 1], links: 7}]",
         "gpus[0]", "7 NVLinks, but Tesla V100-SXM2-16GB has 6"),
        ("an NVLink to a GPU that is not there",
         f"name: x\nproduct: Tesla V100-SXM2-16GB\ngpus: [{GOOD_GPU}]\nnvlinks: [{{gpus: [0, 1]}}]",
         "nvlinks[0].gpus", "two distinct GPU indices below 1"),
        ("two GPUs on one bus",
         f"name: x\nproduct: Tesla T4\ngpus: [{GOOD_GPU}, {GOOD_GPU}]",
         "gpus[1]", "pci_bus_id 00000000:07:00.0 already used by gpus[0]"),
        ("an unknown init error",
         f"name: x\nproduct: Tesla T4\ninit_error: Boom\ngpus: [{GOOD_GPU}]",
         "init_error", "'Boom' is not one of"),
        ("not YAML", "name: [x", "", "not valid YAML"),
        ("not a mapping", "- just\n- a list", "", "must be a mapping"),
    ],
)
def test_a_bad_machine_file_names_the_file_and_the_field(
    tmp_path: Path, case: str, text: str, field: str, why: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(MachineError) as caught:
        load_machine(str(path))
    message = str(caught.value)
    assert str(path) in message
    assert any(p.startswith(f"{field}: ") or not field for p in caught.value.problems), message
    assert why in message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nproduct: Tesla T5\ncolour: green\ngpus: [{pci_bus_id: 7}]")
    with pytest.raises(MachineError) as caught:
        load_machine(str(path))
    fields = sorted(p.split(":")[0] for p in caught.value.problems)
    assert fields == ["colour", "gpus[0].pci_bus_id", "product"]


def test_a_missing_file_lists_the_builtin_machines() -> None:
    with pytest.raises(MachineError, match="neither a built-in machine .*dgx-a100.* nor a "
                                           "readable file"):
        load_machine("/nonexistent/dgx-b200.yaml")


def test_load_library_lets_a_bad_machine_through_as_machine_error(tmp_path: Path) -> None:
    # Not NvmlUnavailable: failOnInitError=false must not hide a wrong --simulated-machine.
    path = write(tmp_path, "name: x\ngpus: []")
    with pytest.raises(MachineError) as caught:
        nvml.load_library(str(path))
    assert not isinstance(caught.value, nvml.NvmlUnavailable)


def test_a_machine_file_with_explicit_identities_is_read_as_written(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
name: custom
product: NVIDIA A100-SXM4-40GB
gpus:
- pci_bus_id: "00000000:07:00.0"
  uuid: GPU-00000000-0000-0000-0000-000000000007
  minor: 3
  numa_node: 1
  mig:
    instances:
    - {profile: 7g.40gb, start: 0, uuid: MIG-00000000-0000-0000-0000-000000000001}
""",
    )
    lib = nvml.load_library(str(path))
    try:
        (gpu,) = nvml.read_inventory(lib).gpus
    finally:
        nvml.shutdown(lib)
    assert (gpu.uuid, gpu.minor, gpu.numa_node) == (
        "GPU-00000000-0000-0000-0000-000000000007", 3, 1)
    assert [m.uuid for m in gpu.mig_devices] == ["MIG-00000000-0000-0000-0000-000000000001"]


def test_the_cli_lists_and_shows_machines(capsys: pytest.CaptureFixture[str]) -> None:
    from sharepack.agent.nvmlsim.__main__ import main

    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(f"{name}:" in listed for name in ("dgx-a100", "dgx1-volta", "t4-pcie"))
    assert main(["show", "dgx1-volta"]) == 0
    shown = capsys.readouterr().out
    assert "pair 2-3: 250" in shown and "pair 0-5: 10" in shown
    assert main(["show", "/nonexistent.yaml"]) == 2
    assert "neither a built-in machine" in capsys.readouterr().err
