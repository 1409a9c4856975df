"""Schedules: the IR (ir), the builder generators use, the verifier and traffic accounting."""

from .builder import Builder
from .ir import BUFFERS, Kind, Layout, Schedule, Step

__all__ = ["Builder", "BUFFERS", "Kind", "Layout", "Schedule", "Step"]
