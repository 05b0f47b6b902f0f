"""CUDA (cuda-bindings, NVIDIA's driver bindings) and NVML (pynvml) in one process.

Allocates through the driver API the way Python frameworks reach it (cuda-bindings loads
libcuda.so.1 and resolves entry points through cuGetProcAddress), then prints one JSON line
with what cuMemGetInfo and nvmlDeviceGetMemoryInfo / the compute process list say at the
same moment, then "holding" and waits for EOF on stdin when asked to.

    python cuda_nvml.py [--alloc SIZE] [--hold]        SIZE like 1G, 512M
"""

import json
import os
import sys

import pynvml as nv
from cuda.bindings import driver as cu

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(text):
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def check(result):
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"CUDA call failed: {err}")
    return values[0] if len(values) == 1 else values


def main():
    args = sys.argv[1:]
    alloc = size(args[args.index("--alloc") + 1]) if "--alloc" in args else 0
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    ptr = check(cu.cuMemAlloc(alloc)) if alloc else None
    free, total = check(cu.cuMemGetInfo())
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    m = nv.nvmlDeviceGetMemoryInfo(h)
    procs = [[p.pid, p.usedGpuMemory] for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
    out = {
        "pid": os.getpid(),
        "cuda": {"free": free, "total": total},
        "nvml": {"total": m.total, "free": m.free, "used": m.used, "procs": procs},
    }
    print(json.dumps(out), flush=True)
    if "--hold" in args:
        print("holding", flush=True)
        sys.stdin.read()
    if ptr is not None:
        check(cu.cuMemFree(ptr))


if __name__ == "__main__":
    main()
