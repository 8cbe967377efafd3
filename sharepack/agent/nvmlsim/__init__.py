"""The NVML simulator: pynvml's API over a described machine (see simulator.py, descriptions.py).

    from sharepack.agent.nvmlsim import SimulatedNvml, load_machine
    lib = SimulatedNvml(load_machine("dgx-a100"))
"""

from sharepack.agent.nvmlsim.descriptions import (
    Machine,
    MachineError,
    builtin_names,
    load_machine,
    parse_machine,
)
from sharepack.agent.nvmlsim.simulator import CONTROL_ENV, SimulatedNvml, control_line

__all__ = [
    "CONTROL_ENV",
    "Machine",
    "MachineError",
    "SimulatedNvml",
    "builtin_names",
    "control_line",
    "load_machine",
    "parse_machine",
]
