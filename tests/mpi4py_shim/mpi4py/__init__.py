"""A stand-in ``mpi4py`` package for the interop test (tests/test_mpi4py_interop.py):
mpi4py's own test files import ``from mpi4py import MPI`` and get polycast behind it."""
