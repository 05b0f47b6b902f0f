"""CuPy under the shim: cudaMemGetInfo, then fill in chunks until
cupy.cuda.memory.OutOfMemoryError, hold, free, allocate again."""

import argparse

from wl_common import MIB, exc_info, fail, hold, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--max-mib", type=int, default=16384)
    a = ap.parse_args()

    import cupy

    dev = cupy.cuda.Device(0)
    dev.use()
    free0, total0 = (int(x) for x in cupy.cuda.runtime.memGetInfo())
    props = cupy.cuda.runtime.getDeviceProperties(0)
    props_total = int(props.get("totalGlobalMem", 0))
    info = {"cupy": cupy.__version__, "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "cuda_driver": cupy.cuda.runtime.driverGetVersion()}
    hold("init", free=free0, total=total0, props_total=props_total, **info)

    chunks = []
    oom = None
    other = None
    for _ in range(a.max_mib // a.chunk_mib):
        try:
            chunks.append(cupy.empty(a.chunk_mib * MIB, dtype=cupy.uint8))
        except cupy.cuda.memory.OutOfMemoryError as e:
            oom = exc_info(e)
            break
        except Exception as e:  # noqa: BLE001 - CUDARuntimeError and friends
            other = exc_info(e)
            break
    dev.synchronize()
    free1, total1 = (int(x) for x in cupy.cuda.runtime.memGetInfo())
    pool = cupy.get_default_memory_pool()
    full = {"chunks": len(chunks), "chunk_mib": a.chunk_mib, "pool_total": int(pool.total_bytes()),
            "oom": oom, "other_error": other, "free": free1, "total": total1}
    hold("full", **full)

    del chunks
    pool.free_all_blocks()
    dev.synchronize()
    free2, _ = (int(x) for x in cupy.cuda.runtime.memGetInfo())
    try:
        x = cupy.ones(1024 * MIB, dtype=cupy.uint8)
        dev.synchronize()
        recovered = {"ok": True}
        del x
    except Exception as e:  # noqa: BLE001
        recovered = {"ok": False, "error": exc_info(e)}
    result(init={"free": free0, "total": total0, "props_total": props_total}, full=full,
           free_after_release=free2, recovered=recovered, **info)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        fail(e)
