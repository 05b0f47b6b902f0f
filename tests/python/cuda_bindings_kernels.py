"""NVIDIA's cuda-bindings launching kernels on the simulated GPU: prints JSON lines.

Every entry point comes through cuGetProcAddress, as NVIDIA's own Python stack resolves
them. The simulator's module image declares a kernel `spin` that runs 1 ms per block of
its grid (docs/simulator.md), so a launch with a grid of N blocks occupies the device for
N ms.

  saturate SECONDS MS_PER_KERNEL   launch kernels back to back (each launch blocks while
                                   the queue is full) for SECONDS, print {"ready": pid}
                                   after the first launch, then synchronise and print
                                   {"pid", "launched"}
  events                           time a 1000 ms kernel with events; query the stream and
                                   events while it runs and after
  graph MS_PER_KERNEL COUNT        capture COUNT launches into a graph, launch it, time it
"""
import json
import os
import sys
import time

from cuda.bindings import driver as cu

IMAGE = b"fgpu-sim-module 4M\nkernel spin 1ms\n\0"


def ok(result):
    if int(result[0]) != 0:
        raise SystemExit(f"cuda-bindings call failed: {result}")
    return result[1] if len(result) == 2 else result[1:]


def rc(result):
    return int(result[0])


def setup():
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    module = ok(cu.cuModuleLoadData(IMAGE))
    return ok(cu.cuModuleGetFunction(module, b"spin"))


def launch(f, blocks, stream):
    ok(cu.cuLaunchKernel(f, blocks, 1, 1, 128, 1, 1, 0, stream, None, 0))


def saturate(seconds, ms):
    f = setup()
    stream = ok(cu.cuStreamCreate(0))
    launch(f, ms, stream)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    launched = 1
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        launch(f, ms, stream)
        launched += 1
    ok(cu.cuStreamSynchronize(stream))
    print(json.dumps({"pid": os.getpid(), "launched": launched}), flush=True)


def events():
    f = setup()
    stream = ok(cu.cuStreamCreate(0))
    start, stop = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
    out = {}
    # A first kernel keeps the device busy, so both events and the timed kernel queue
    # behind it: the timed interval is exactly the second kernel.
    launch(f, 500, stream)
    ok(cu.cuEventRecord(start, stream))
    launch(f, 1000, stream)
    ok(cu.cuEventRecord(stop, stream))
    out["stream_query_running"] = rc(cu.cuStreamQuery(stream))
    out["event_query_running"] = rc(cu.cuEventQuery(stop))
    out["elapsed_running"] = rc(cu.cuEventElapsedTime(start, stop))
    t0 = time.monotonic()
    ok(cu.cuEventSynchronize(stop))
    out["waited_ms"] = (time.monotonic() - t0) * 1000
    out["event_query_done"] = rc(cu.cuEventQuery(stop))
    out["stream_query_done"] = rc(cu.cuStreamQuery(stream))
    out["elapsed_ms"] = float(ok(cu.cuEventElapsedTime(start, stop)))
    ok(cu.cuCtxSynchronize())
    print(json.dumps(out), flush=True)


def graph(ms, count):
    f = setup()
    stream = ok(cu.cuStreamCreate(0))
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
    ok(cu.cuStreamBeginCapture(stream, mode))
    for _ in range(count):
        launch(f, ms, stream)
    g = ok(cu.cuStreamEndCapture(stream))
    nodes, n = cu.cuGraphGetNodes(g, 0)[1:]
    exec_ = ok(cu.cuGraphInstantiate(g, 0))
    start, stop = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
    launch(f, 300, stream)
    ok(cu.cuEventRecord(start, stream))
    ok(cu.cuGraphLaunch(exec_, stream))
    ok(cu.cuEventRecord(stop, stream))
    out = {"nodes": int(n), "query_running": rc(cu.cuStreamQuery(stream))}
    ok(cu.cuStreamSynchronize(stream))
    out["elapsed_ms"] = float(ok(cu.cuEventElapsedTime(start, stop)))
    print(json.dumps(out), flush=True)


cmd = sys.argv[1]
if cmd == "saturate":
    saturate(float(sys.argv[2]), int(sys.argv[3]))
elif cmd == "events":
    events()
elif cmd == "graph":
    graph(int(sys.argv[2]), int(sys.argv[3]))
else:
    raise SystemExit(f"unknown command {cmd!r}")
