"""Whether this machine has an NVIDIA driver: tests of the real-pynvml path run only where it does."""

from __future__ import annotations

import pynvml


def driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True
