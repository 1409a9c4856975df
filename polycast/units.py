"""Parsing and printing of sizes (bytes) and rates (bits or bytes per second).

Sizes use binary prefixes for ``KiB``/``MiB``/``GiB`` and decimal ones for ``KB``/``MB``/``GB``,
as nccl-tests and most storage tools do. Rates follow networking usage: ``Gbps`` / ``Gbit/s``
are 1e9 *bits* per second; ``GB/s`` is 1e9 bytes per second.
"""

from __future__ import annotations

import re

from .errors import InvalidArgument

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}

# value: multiplier to bits per second
_RATE_UNITS = {
    "bps": 1, "bit/s": 1,
    "kbps": 1e3, "kbit/s": 1e3, "mbps": 1e6, "mbit/s": 1e6,
    "gbps": 1e9, "gbit/s": 1e9, "tbps": 1e12, "tbit/s": 1e12,
    "b/s": 8, "kb/s": 8e3, "mb/s": 8e6, "gb/s": 8e9, "tb/s": 8e12,
}

_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse ``"64MiB"``, ``"1KB"``, ``"4096"`` or an int into a whole number of bytes."""
    if isinstance(text, int):
        if text < 0:
            raise InvalidArgument(f"size must be >= 0, got {text}")
        return text
    m = _NUM.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise InvalidArgument(
            f"cannot parse size {text!r}; use a number with an optional unit: "
            "B, KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB (decimal), e.g. 64MiB")
    value = float(m.group(1)) * _SIZE_UNITS[unit]
    if value != int(value):
        raise InvalidArgument(f"size {text!r} is not a whole number of bytes")
    return int(value)


def parse_rate(text: str | float) -> float:
    """Parse ``"400Gbps"``, ``"1.6Tbit/s"`` or ``"50GB/s"`` into **bits** per second."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _NUM.match(str(text))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _RATE_UNITS:
            raise InvalidArgument(
                f"cannot parse rate {text!r}; use e.g. 400Gbps, 100Gbit/s, 1.6Tbps or 50GB/s")
        value = float(m.group(1)) * _RATE_UNITS[unit]
    if value <= 0:
        raise InvalidArgument(f"rate must be > 0, got {text!r}")
    return value


_FREQ_UNITS = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}


def parse_frequency(text: str | float) -> float:
    """Parse ``"1.8GHz"``, ``"2600MHz"`` into hertz. A unit is required (a bare ``1.8`` could
    be GHz or Hz)."""
    m = _NUM.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _FREQ_UNITS:
        raise InvalidArgument(f"cannot parse frequency {text!r}; use a number with a unit: "
                              "Hz, kHz, MHz or GHz, e.g. 1.8GHz")
    value = float(m.group(1)) * _FREQ_UNITS[unit]
    if value <= 0:
        raise InvalidArgument(f"frequency must be > 0, got {text!r}")
    return value


def format_size(nbytes: int) -> str:
    """``67108864 -> '64MiB'``; exact binary units when they divide, else bytes."""
    for unit, mult in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return f"{nbytes}B"
