"""The simulator's own error (both paths raise it: polycast/sim/driver.py, fast.py)."""

from __future__ import annotations

from ..errors import PolycastError


class SimulationError(PolycastError):
    """The simulation could not finish: a request failed, or a bound was exceeded."""
