"""Fake JAX (self-test only): preallocates 0.75 of the total it sees."""
import os

import fakegpu as m

from . import numpy  # noqa: F401

__version__ = "0.0.0+fake"
_held = []


class _Device:
    device_kind = "Fake GPU"

    class client:  # noqa: N801
        platform_version = "fake"

    def memory_stats(self):
        return {"bytes_limit": _held[0], "bytes_in_use": 0}


def devices(kind=None):
    if os.environ.get("FAKEGPU_JAX_NOGPU_HOOKED") and os.environ.get("LD_PRELOAD"):
        raise RuntimeError("Unknown backend gpu (under the shim)")
    if os.environ.get("FAKEGPU_JAX_NOGPU"):
        raise RuntimeError("Unknown backend gpu")
    if not _held:
        m.init()
        n = int(m.mem_info()[1] * 0.75)
        if not m.alloc(n):
            raise RuntimeError("preallocation failed")
        _held.append(n)
    return [_Device()]
