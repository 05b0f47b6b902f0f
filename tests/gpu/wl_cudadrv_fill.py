"""cuda-bindings (the driver API, entry points through cuGetProcAddress) under the
shim: cuDeviceTotalMem, cuMemGetInfo, then cuMemAlloc in chunks until
CUDA_ERROR_OUT_OF_MEMORY, hold, free, allocate again."""

import argparse

from wl_common import MIB, check_cu, cu_code, fail, hold, load_cuda_driver, result

OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--max-mib", type=int, default=16384)
    a = ap.parse_args()

    cu = load_cuda_driver()
    check_cu(cu, cu.cuInit(0), "cuInit")
    dev = check_cu(cu, cu.cuDeviceGet(0), "cuDeviceGet")
    total_mem = int(check_cu(cu, cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))
    drv = int(check_cu(cu, cu.cuDriverGetVersion(), "cuDriverGetVersion"))
    ctx = check_cu(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check_cu(cu, cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    free0, total0 = (int(x) for x in check_cu(cu, cu.cuMemGetInfo(), "cuMemGetInfo"))
    hold("init", free=free0, total=total0, device_total_mem=total_mem, driver_version=drv)

    ptrs = []
    err = None
    for _ in range(a.max_mib // a.chunk_mib):
        res = cu.cuMemAlloc(a.chunk_mib * MIB)
        code = cu_code(res[0])
        if code != 0:
            err = code
            break
        ptrs.append(res[1])
    check_cu(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")
    free1, total1 = (int(x) for x in check_cu(cu, cu.cuMemGetInfo(), "cuMemGetInfo"))
    full = {"chunks": len(ptrs), "chunk_mib": a.chunk_mib, "error_code": err,
            "oom": err == OOM, "free": free1, "total": total1}
    hold("full", **full)

    for p in ptrs:
        check_cu(cu, cu.cuMemFree(p), "cuMemFree")
    ptrs = []
    free2, _ = (int(x) for x in check_cu(cu, cu.cuMemGetInfo(), "cuMemGetInfo"))
    res = cu.cuMemAlloc(1024 * MIB)
    recovered = {"ok": cu_code(res[0]) == 0, "code": cu_code(res[0])}
    if recovered["ok"]:
        check_cu(cu, cu.cuMemFree(res[1]), "cuMemFree")
    result(init={"free": free0, "total": total0, "device_total_mem": total_mem}, full=full,
           free_after_release=free2, recovered=recovered, driver_version=drv)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        fail(e)
