"""Shared by the workloads (wl_*.py), which run under the shim (LD_PRELOAD).

A workload prints `@HOLD <tag> <json>` when it holds memory and then blocks until
the parent (check.py, unhooked) has sampled NVML and written a line to stdin. At the
end it prints one `@RESULT <json>` line.
"""

import json
import os
import sys
import time
import traceback

MIB = 1 << 20


def hold(tag, **data):
    data.setdefault("pid", os.getpid())
    data.setdefault("time", time.time())
    sys.stdout.write("@HOLD %s %s\n" % (tag, json.dumps(data)))
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:  # parent gone
        os._exit(3)
    return line.strip()


def result(**data):
    data.setdefault("pid", os.getpid())
    sys.stdout.write("@RESULT %s\n" % json.dumps(data))
    sys.stdout.flush()


def fail(exc):
    """Report an unexpected exception as the result and exit non-zero."""
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    result(error="%s: %s" % (type(exc).__name__, str(exc)[:500]), traceback="".join(tb)[-2000:])
    sys.stdout.flush()
    os._exit(1)


def exc_info(exc):
    return {"type": type(exc).__name__,
            "module": type(exc).__module__,
            "message": str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""}


class Backend:
    """Minimal allocate/free/mem-info over cuda-bindings, torch or CuPy."""

    def __init__(self, via):
        order = ["cuda-bindings", "torch", "cupy"] if via == "auto" else [via]
        last = None
        for name in order:
            try:
                getattr(self, "_init_" + name.replace("-", "_"))()
                self.name = name
                return
            except ImportError as e:
                last = e
        raise ImportError("no GPU framework importable (%s): %s" % (",".join(order), last))

    # cuda-bindings -------------------------------------------------------
    def _init_cuda_bindings(self):
        cu = load_cuda_driver()
        self.cu = cu
        check_cu(cu, cu.cuInit(0), "cuInit")
        dev = check_cu(cu, cu.cuDeviceGet(0), "cuDeviceGet")
        ctx = check_cu(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        check_cu(cu, cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.dev = dev

        def alloc(nbytes):
            res = cu.cuMemAlloc(nbytes)
            code = cu_code(res[0])
            if code == 0:
                return res[1]
            if code == 2:
                raise MemoryError("CUDA_ERROR_OUT_OF_MEMORY")
            raise RuntimeError("cuMemAlloc failed with CUresult %d" % code)

        def free(ptr):
            check_cu(cu, cu.cuMemFree(ptr), "cuMemFree")

        def mem_info():
            res = cu.cuMemGetInfo()
            if cu_code(res[0]) != 0:
                raise RuntimeError("cuMemGetInfo failed with CUresult %d" % cu_code(res[0]))
            return int(res[1]), int(res[2])

        self.alloc, self.free, self.mem_info = alloc, free, mem_info
        self.sync = lambda: check_cu(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")

    # torch ---------------------------------------------------------------
    def _init_torch(self):
        import torch
        torch.cuda.init()
        torch.empty(1, device="cuda")

        def alloc(nbytes):
            try:
                return torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as e:
                raise MemoryError(str(e)[:200])

        def free(t):
            del t
            torch.cuda.empty_cache()

        self.alloc, self.free = alloc, free
        self.mem_info = lambda: tuple(int(x) for x in torch.cuda.mem_get_info())
        self.sync = torch.cuda.synchronize

    # cupy ----------------------------------------------------------------
    def _init_cupy(self):
        import cupy
        cupy.cuda.Device(0).use()
        cupy.empty(1, dtype=cupy.uint8)

        def alloc(nbytes):
            try:
                return cupy.cuda.memory.alloc(nbytes)
            except cupy.cuda.memory.OutOfMemoryError as e:
                raise MemoryError(str(e)[:200])

        def free(m):
            del m
            cupy.get_default_memory_pool().free_all_blocks()

        self.alloc, self.free = alloc, free
        self.mem_info = lambda: tuple(int(x) for x in cupy.cuda.runtime.memGetInfo())
        self.sync = lambda: cupy.cuda.Device(0).synchronize()


def load_cuda_driver():
    """NVIDIA's cuda-bindings: `cuda.bindings.driver`, or the older `cuda.cuda`."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        from cuda import cuda as cu  # cuda-python < 12.6
    return cu


def cu_code(err):
    try:
        return int(err)
    except (TypeError, ValueError):
        return int(getattr(err, "value", err))


def check_cu(cu, res, what):
    if not isinstance(res, tuple):
        res = (res,)
    code = cu_code(res[0])
    if code != 0:
        raise RuntimeError("%s failed with CUresult %d" % (what, code))
    if len(res) == 1:
        return None
    return res[1] if len(res) == 2 else res[1:]
