"""A module a warm parent preloads in tests/python/test_distributed.py: ``shim`` stands for
a framework's CPU shims (called once, in the parent); ``broken`` fails its import."""

CALLED = []


def shim():
    import os

    CALLED.append(os.getpid())


def broken():
    raise ImportError("this preload fails on purpose")
