"""NVIDIA's cuda-bindings under fgpu, graph memory: prints one JSON line.

Builds a graph with one memory allocation node of the given size in MiB and the node that
frees it, launches it, reads what cuMemGetInfo and the graph pool say, trims the pool and
reads cuMemGetInfo again. Every entry point comes through cuGetProcAddress.
"""
import json
import sys

from cuda.bindings import driver as cu


def ok(result):
    if int(result[0]) != 0:
        raise SystemExit(f"cuda-bindings call failed: {result}")
    return result[1] if len(result) == 2 else result[1:]


size = int(sys.argv[1]) << 20
out = {}
ok(cu.cuInit(0))
dev = ok(cu.cuDeviceGet(0))
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(dev))))
graph = ok(cu.cuGraphCreate(0))
params = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
params.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
params.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
params.poolProps.location.id = 0
params.bytesize = size
node = ok(cu.cuGraphAddMemAllocNode(graph, None, 0, params))
ok(cu.cuGraphAddMemFreeNode(graph, [node], 1, params.dptr))
exec_ = ok(cu.cuGraphInstantiate(graph, 0))
out["launch"] = int(cu.cuGraphLaunch(exec_, cu.CUstream(0))[0])
attr = cu.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT
out["graph_reserved"] = int(ok(cu.cuDeviceGetGraphMemAttribute(dev, attr)))
out["free_after_launch"] = int(ok(cu.cuMemGetInfo())[0])
out["trim"] = int(cu.cuDeviceGraphMemTrim(dev)[0])
out["free_after_trim"] = int(ok(cu.cuMemGetInfo())[0])
print(json.dumps(out))
