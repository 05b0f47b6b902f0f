"""A stand-in for `python train.py` under `fgpu run`, with nothing but the standard library.

It loads libcuda.so.1 with ctypes (dlopen, then dlsym for each function, as many Python
bindings do), reads the GPU's memory, takes PARENT_GIB GiB, then runs itself again as a
child process that asks for CHILD_GIB GiB while the parent still holds its share. Prints
one JSON line: what the parent saw and got, with the child's line (and its stderr) inside.

    python train.py PARENT_GIB CHILD_GIB
    python train.py --child GIB
"""
import ctypes
import json
import subprocess
import sys

GIB = 1 << 30


def gpu():
    cuda = ctypes.CDLL("libcuda.so.1")
    out = {"init": cuda.cuInit(0)}
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    out["device"] = cuda.cuDeviceGet(ctypes.byref(dev), 0)
    out["context"] = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    out["info"] = cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    out["total"] = total.value
    return cuda, out


def take(cuda, gib):
    ptr = ctypes.c_uint64()
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    return cuda.cuMemAlloc_v2(ctypes.byref(ptr), gib * GIB)


def main():
    if sys.argv[1] == "--child":
        cuda, out = gpu()
        out["alloc"] = take(cuda, int(sys.argv[2]))
        print(json.dumps(out))
        return
    cuda, out = gpu()
    out["alloc"] = take(cuda, int(sys.argv[1]))
    child = subprocess.run([sys.executable, __file__, "--child", sys.argv[2]], capture_output=True, text=True)
    if child.returncode != 0:
        sys.exit(f"child failed ({child.returncode}): {child.stdout}{child.stderr}")
    out["child"] = json.loads(child.stdout)
    out["child"]["stderr"] = child.stderr
    print(json.dumps(out))


main()
