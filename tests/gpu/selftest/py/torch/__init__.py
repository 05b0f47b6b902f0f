"""Fake torch (self-test only): what the workloads call."""
import os
import time

import fakegpu as m

__version__ = "0.0.0+fake"
uint8 = "uint8"
bfloat16 = "bfloat16"


class version:  # noqa: N801
    cuda = "13.0"


class OutOfMemoryError(RuntimeError):
    pass


class _Tensor:
    def __init__(self, n):
        self.n = n

    def __matmul__(self, other):
        _computing()
        time.sleep(0.001)
        return _Tensor(0)

    def fill_(self, v):
        return self

    def __del__(self):
        if self.n:
            m.free(self.n)


_started = []


def _computing():
    if not _started:
        _started.append(True)
        m.compute_start()


def empty(n, dtype=None, device=None):
    m.init()
    if n and not m.alloc(n):
        raise OutOfMemoryError("CUDA out of memory (fake)")
    return _Tensor(n)


def randn(*a, **k):
    return _Tensor(0)


class Generator:
    def __init__(self, device=None):
        pass

    def manual_seed(self, seed):
        return self


class _Stream:
    def wait_stream(self, other):
        pass


class _StreamContext:
    def __init__(self, stream):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Graph:
    def __init__(self):
        self.calls = 0

    def replay(self):
        _computing()
        time.sleep(0.004)


class cuda:  # noqa: N801
    OutOfMemoryError = OutOfMemoryError
    Stream = _Stream
    CUDAGraph = _Graph

    @staticmethod
    def stream(s):
        return _StreamContext(s)

    @staticmethod
    def graph(g):
        return _StreamContext(g)

    @staticmethod
    def current_stream():
        return _Stream()

    @staticmethod
    def init():
        m.init()

    @staticmethod
    def mem_get_info():
        if os.environ.get("FAKEGPU_HANG") and os.environ.get("LD_PRELOAD"):
            time.sleep(1000)
        m.init()
        return m.mem_info()

    @staticmethod
    def get_device_properties(i):
        class Props:
            total_memory = m.total()
        return Props

    @staticmethod
    def get_allocator_backend():
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        return "cudaMallocAsync" if "cudaMallocAsync" in conf else "native"

    @staticmethod
    def get_device_name(i):
        return "Fake GPU"

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def memory_allocated():
        return 0

    @staticmethod
    def memory_reserved():
        return 0
