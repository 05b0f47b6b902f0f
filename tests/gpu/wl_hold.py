"""Hold N MiB (one allocation) and report what CUDA says; used by the nvidia-smi and
two-process checks.

  --mib N            allocate N MiB (0: only create a context)
  --via B            cuda-bindings | torch | cupy | auto (first importable)
  --retry-after-go   two-process role B: the first attempt may fail with out-of-memory;
                     after the parent's go, retry every 50 ms for up to --retry-s seconds
"""

import argparse
import time

from wl_common import MIB, Backend, fail, hold, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=0)
    ap.add_argument("--via", default="auto")
    ap.add_argument("--retry-after-go", action="store_true")
    ap.add_argument("--retry-s", type=float, default=10.0)
    a = ap.parse_args()

    be = Backend(a.via)
    free0, total0 = be.mem_info()
    held = []
    first = "ok"
    if a.mib > 0:
        try:
            held.append(be.alloc(a.mib * MIB))
            be.sync()
        except MemoryError:
            first = "oom"
    free1, total1 = be.mem_info()
    hold("held", via=be.name, mib=a.mib, first=first, free_before=free0, total_before=total0,
         free=free1, total=total1)

    retry = {}
    if a.retry_after_go and first == "oom":
        start = time.time()
        attempts = 0
        while time.time() - start < a.retry_s:
            attempts += 1
            try:
                held.append(be.alloc(a.mib * MIB))
                be.sync()
                retry = {"ok": True, "t_success": time.time(), "attempts": attempts}
                break
            except MemoryError:
                time.sleep(0.05)
        else:
            retry = {"ok": False, "attempts": attempts, "t_gave_up": time.time()}
        free2, total2 = be.mem_info()
        hold("retried", free=free2, total=total2, **retry)

    result(via=be.name, first=first, free=free1, total=total1, retry=retry)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        fail(e)
