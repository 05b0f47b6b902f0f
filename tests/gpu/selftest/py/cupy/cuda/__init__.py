"""Fake cupy.cuda (self-test only)."""
import types

import fakegpu as m


class Device:
    def __init__(self, i=0):
        pass

    def use(self):
        m.init()

    def synchronize(self):
        pass


class OutOfMemoryError(MemoryError):
    pass


class _Mem:
    def __init__(self, n):
        self.n = n

    def __del__(self):
        m.free(self.n)


def _alloc(n):
    m.init()
    if not m.alloc(n):
        raise OutOfMemoryError("out of memory (fake)")
    return _Mem(n)


memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError, alloc=_alloc)
runtime = types.SimpleNamespace(memGetInfo=m.mem_info,
                                getDeviceProperties=lambda i: {"totalGlobalMem": m.total()},
                                runtimeGetVersion=lambda: 13000, driverGetVersion=lambda: 13000)
