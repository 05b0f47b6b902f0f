"""JAX under the shim with its default preallocation (the parent removes every
XLA_PYTHON_CLIENT_* variable): run one matrix product, read the allocator's limit,
hold while the parent samples NVML."""

import importlib

from wl_common import exc_info, fail, hold, result


def version(mod):
    try:
        return importlib.import_module(mod).__version__
    except Exception:  # noqa: BLE001
        return None


def main():
    import jax
    import jax.numpy as jnp

    info = {"jax": jax.__version__, "jaxlib": version("jaxlib")}
    try:
        devs = jax.devices("gpu")
    except Exception as e:  # noqa: BLE001 - no GPU backend
        result(no_gpu=exc_info(e), **info)
        return
    d = devs[0]
    x = jnp.ones((2048, 2048), dtype=jnp.float32)
    y = (x @ x).block_until_ready()
    correct = float(y[0, 0]) == 2048.0
    try:
        stats = d.memory_stats() or {}
    except Exception:  # noqa: BLE001
        stats = {}
    keep = {k: int(v) for k, v in stats.items()
            if k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use", "bytes_reserved",
                     "largest_free_block_bytes", "pool_bytes")}
    try:
        info.update(device=str(d.device_kind), platform_version=str(d.client.platform_version))
    except Exception:  # noqa: BLE001 - informational only
        pass
    hold("prealloc", correct=correct, stats=keep, **info)
    result(correct=correct, stats=keep, **info)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        fail(e)
