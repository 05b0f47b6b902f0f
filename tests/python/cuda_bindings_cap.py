"""NVIDIA's cuda-bindings (cuda.bindings.driver) under fgpu: prints one JSON line.

It loads libcuda.so.1 and resolves every entry point through cuGetProcAddress, as NVIDIA's
own Python stack does. Argument: the chunk size in MiB to fill the GPU with.
"""
import json
import sys

from cuda.bindings import driver as cu


def check(result):
    err = result[0]
    return int(err), result[1:]


chunk = int(sys.argv[1]) << 20
out = {}
err, _ = check(cu.cuInit(0))
out["init"] = err
err, (dev,) = check(cu.cuDeviceGet(0))
err, (ctx,) = check(cu.cuDevicePrimaryCtxRetain(dev))
out["ctx"] = err
check(cu.cuCtxSetCurrent(ctx))
err, (total,) = check(cu.cuDeviceTotalMem(dev))
out["device_total"] = int(total)
err, (free, total) = check(cu.cuMemGetInfo())
out["info_free"], out["info_total"] = int(free), int(total)
ptrs = []
while True:
    err, (ptr,) = check(cu.cuMemAlloc(chunk))
    if err != 0:
        out["fill_error"] = err
        out["fill_error_name"] = cu.cuGetErrorName(cu.CUresult(err))[1].decode()
        break
    ptrs.append(ptr)
    if len(ptrs) > 10000:
        break
out["filled_bytes"] = len(ptrs) * chunk
for ptr in ptrs:
    check(cu.cuMemFree(ptr))
err, (free, total) = check(cu.cuMemGetInfo())
out["free_after"] = int(free)
print(json.dumps(out))
