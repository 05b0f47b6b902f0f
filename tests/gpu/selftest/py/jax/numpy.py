"""Fake jax.numpy (self-test only)."""
float32 = "float32"


class _Array:
    def __init__(self, v):
        self.v = v

    def __matmul__(self, other):
        return _Array(2048.0)

    def block_until_ready(self):
        return self

    def __getitem__(self, i):
        return self.v


def ones(shape, dtype=None):
    return _Array(1.0)
