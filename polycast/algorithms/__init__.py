"""Collective algorithms as schedule generators, and their registry.

``build(collective, algorithm, nranks, count, root=0, nchunks=1, channels=1, **options)``
is the one way to get a schedule."""

from .registry import Algorithm, Spec, algorithms, build, get, register, supported

__all__ = ["Algorithm", "Spec", "algorithms", "build", "get", "register", "supported"]
