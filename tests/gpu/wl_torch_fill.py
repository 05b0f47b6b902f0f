"""PyTorch under the shim: mem_get_info, then fill the GPU in fixed chunks until
torch.OutOfMemoryError, hold (the parent samples NVML), free, and check that memory
can be allocated again. The allocator backend comes from PYTORCH_CUDA_ALLOC_CONF.

  --chunk-mib N   chunk size (256)
  --max-mib N     stop without an error after this much (a missing cap would
                  otherwise fill the whole card)
"""

import argparse
import os

from wl_common import MIB, exc_info, fail, hold, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--max-mib", type=int, default=16384)
    a = ap.parse_args()

    import torch

    free0, total0 = (int(x) for x in torch.cuda.mem_get_info())
    props_total = int(torch.cuda.get_device_properties(0).total_memory)
    try:
        backend = torch.cuda.get_allocator_backend()
    except Exception:  # older torch
        backend = "unknown"
    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "backend": backend,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "device_name": torch.cuda.get_device_name(0)}
    hold("init", free=free0, total=total0, props_total=props_total, **info)

    chunks = []
    oom = None
    other = None
    for _ in range(a.max_mib // a.chunk_mib):
        try:
            chunks.append(torch.empty(a.chunk_mib * MIB, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as e:
            oom = exc_info(e)
            break
        except RuntimeError as e:  # an error that is not torch's out-of-memory
            other = exc_info(e)
            break
    torch.cuda.synchronize()
    free1, total1 = (int(x) for x in torch.cuda.mem_get_info())
    full = {"chunks": len(chunks), "chunk_mib": a.chunk_mib,
            "allocated": int(torch.cuda.memory_allocated()),
            "reserved": int(torch.cuda.memory_reserved()),
            "oom": oom, "other_error": other, "free": free1, "total": total1}
    hold("full", **full)

    del chunks
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    free2, _ = (int(x) for x in torch.cuda.mem_get_info())
    recovered = None
    try:
        x = torch.empty(1024 * MIB, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
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
