"""A CUDA driver API client (ctypes on libcuda.so.1, by the exported names) that reports
what CUDA sees of its device 0: one JSON line per step.

Steps (arguments, in order):
  info          count, name, UUID from cuDeviceGetUuid and from cuDeviceGetUuid_v2,
                cuDeviceTotalMem_v2, the multiprocessor count, cuMemGetInfo after a
                context is made
  alloc SIZE    cuMemAlloc_v2 of SIZE bytes (rc and cuMemGetInfo after)
  run MS        queues MS one-millisecond kernels (a simulator module) and waits for them
  hold          prints {"holding": true} and waits until stdin closes
"""
import ctypes
import json
import sys

cu = ctypes.CDLL("libcuda.so.1")
out = lambda **kv: print(json.dumps(kv), flush=True)


def check(rc, what):
    if rc != 0:
        out(error=what, rc=rc)
        sys.exit(1)


def uuid_text(raw):
    h = bytes(raw).hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def mem_info():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
    return free.value, total.value


check(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

args = sys.argv[1:]
k = 0
while k < len(args):
    step = args[k]
    if step == "info":
        count = ctypes.c_int()
        check(cu.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        name = ctypes.create_string_buffer(256)
        check(cu.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
        v1, v2 = (ctypes.c_ubyte * 16)(), (ctypes.c_ubyte * 16)()
        check(cu.cuDeviceGetUuid(v1, dev), "cuDeviceGetUuid")
        check(cu.cuDeviceGetUuid_v2(v2, dev), "cuDeviceGetUuid_v2")
        total = ctypes.c_size_t()
        check(cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev), "cuDeviceTotalMem_v2")
        sms = ctypes.c_int()
        check(cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev), "cuDeviceGetAttribute")
        free, mem_total = mem_info()
        out(count=count.value, name=name.value.decode(), uuid=uuid_text(v1), uuid_v2=uuid_text(v2),
            total_mem=total.value, sms=sms.value, free=free, mem_total=mem_total)
    elif step == "alloc":
        k += 1
        ptr = ctypes.c_uint64()
        rc = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(args[k])))
        free, total = mem_info()
        out(alloc=int(args[k]), rc=rc, free=free, total=total)
    elif step == "run":
        k += 1
        module, func = ctypes.c_void_p(), ctypes.c_void_p()
        check(cu.cuModuleLoadData(ctypes.byref(module), b"fgpu-sim-module\nkernel spin 1ms\n\0"), "cuModuleLoadData")
        check(cu.cuModuleGetFunction(ctypes.byref(func), module, b"spin"), "cuModuleGetFunction")
        n = int(args[k])
        for _ in range(n):
            check(cu.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, None, None, None), "cuLaunchKernel")
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        out(ran_ms=n)
    elif step == "hold":
        out(holding=True)
        sys.stdin.read()
    k += 1
