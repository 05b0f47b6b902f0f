"""Fake cuda.bindings.driver (self-test only): (CUresult, values...) tuples."""
import enum

import fakegpu as m


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2


OK = CUresult.CUDA_SUCCESS
_next = [1 << 40]
_live = {}


def cuInit(flags):
    return (OK,)


def cuDeviceGet(i):
    return (OK, i)


def cuDeviceTotalMem(dev):
    return (OK, m.total())


def cuDriverGetVersion():
    return (OK, 13000)


def cuDevicePrimaryCtxRetain(dev):
    m.init()
    return (OK, object())


def cuCtxSetCurrent(ctx):
    return (OK,)


def cuCtxSynchronize():
    return (OK,)


def cuMemGetInfo():
    free, total = m.mem_info()
    return (OK, free, total)


def cuMemAlloc(n):
    if not m.alloc(n):
        return (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
    _next[0] += n
    _live[_next[0]] = n
    return (OK, _next[0])


def cuMemFree(ptr):
    m.free(_live.pop(ptr))
    return (OK,)
