"""Compute-share workload (run under the shim with FGPU_COMPUTE, or without it as the
uncapped neighbour): bf16 matrix products back to back, as plain launches or replayed
from a CUDA graph (torch.cuda.CUDAGraph, captured in PyTorch's default global capture
mode). Prints `@HOLD running` once warm, without waiting for an answer (check.py measures
while it runs), then one `@RESULT` with its iteration count when the time is up."""

import argparse
import json
import sys
import time

from wl_common import fail, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--graphs", action="store_true")
    ap.add_argument("--per-graph", type=int, default=8, help="matrix products per graph")
    a = ap.parse_args()

    import torch
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16, generator=g)
    step = None
    if a.graphs:
        # Warm up on a side stream, then capture (PyTorch's recipe for graph capture).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                y = x @ w
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(a.per_graph):
                y = x @ w
        step = graph.replay
    else:
        def step():
            return x @ w
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    started = time.time()
    sys.stdout.write("@HOLD running %s\n" % json.dumps({"time": started, "graphs": a.graphs}))
    sys.stdout.flush()
    iters = 0
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        step()
        iters += 1
        if iters % 16 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    result(iterations=iters, seconds=time.time() - started, graphs=a.graphs,
           products=iters * (a.per_graph if a.graphs else 1))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        fail(e)
