"""Fake cuda-bindings (self-test only)."""
