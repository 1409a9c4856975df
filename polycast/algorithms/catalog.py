"""Imports every generator module so that each registers its algorithms."""

from . import allgather  # noqa: F401
