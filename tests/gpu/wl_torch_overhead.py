"""Fixed PyTorch workload for the overhead check, run with and without the shim:
bf16 matrix products, then an allocation-heavy loop (the parent sets
PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every torch.empty/del reaches cudaMalloc and
cudaFree and therefore the shim's hooks). Prints its phase times."""

import argparse
import os
import time

from wl_common import MIB, fail, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--matmuls", type=int, default=100)
    ap.add_argument("--allocs", type=int, default=2000)
    a = ap.parse_args()

    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    free, total = (int(x) for x in torch.cuda.mem_get_info())

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16, generator=g)
    for _ in range(5):
        y = x @ w
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    for _ in range(a.matmuls):
        y = x @ w
    torch.cuda.synchronize()
    t4 = time.perf_counter()

    # Allocation-heavy: sizes from 1 to 64 MiB in a fixed pseudo-random order,
    # some freed at once, some kept in small batches.
    batch = []
    for i in range(a.allocs):
        size = ((i * 7919) % 64 + 1) * MIB
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        if i % 4 == 0:
            batch.append(t)
            if len(batch) >= 8:
                batch = []
        del t
    batch = []
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    del x, w, y
    result(import_s=t1 - t0, init_s=t2 - t1, matmul_s=t4 - t3, alloc_s=t5 - t4,
           work_s=t5 - t3, total_s=t5 - t0, free=free, total=total, torch=torch.__version__,
           caching_disabled=os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        fail(e)
