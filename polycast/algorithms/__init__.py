"""Collective algorithms as schedule generators, and their registry.

``build(collective, algorithm, nranks, count, root=0, nchunks=1, channels=1, **options)``
is the one way to get a schedule."""

from .registry import Algorithm, Spec, algorithms, build, get, register, supported
# The generator modules register themselves on import (any import of a module of this
# package runs this file first, so the registry is full before anyone asks it).
from . import catalog  # noqa: E402,F401

__all__ = ["Algorithm", "Spec", "algorithms", "build", "get", "register", "supported"]
