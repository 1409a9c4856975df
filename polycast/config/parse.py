"""The configuration's parsers: a variable's text -> its value, or a ValueError saying what
the variable accepts (polycast.config.params names one per parameter; the error becomes a
one-line InvalidArgument naming the variable). One boolean parser for every switch."""

from __future__ import annotations

from typing import Callable

from ..errors import InvalidArgument
from ..units import format_size, parse_size

#: POLYCAST_DEBUG's values and the level each means.
DEBUG_LEVELS = {"": 0, "WARN": 0, "INFO": 1, "TRACE": 2}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(text: str) -> bool:
    """The one boolean parser: 1/true/yes/on and 0/false/no/off, any case."""
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError("must be 1/true/yes/on or 0/false/no/off")


def integer(lo: int, hi: int | None = None, what: str = "an integer", note: str = ""
            ) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < lo or hi is not None and v > hi:
            raise ValueError(f"must be {what} " + (f"in {lo}..{hi}" if hi is not None
                                                   else f">= {lo}") + note)
        return v
    return parse


def byte_size(lo: int, least: str | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = parse_size(text.strip())
        except (InvalidArgument, ValueError):
            v = None
        if v is None or v < lo:
            raise ValueError("must be an integer number of bytes (or a size such as 64KiB)"
                             + (f", at least {least or lo}" if lo else ""))
        return v
    return parse


def number(at_least_zero: bool, message: str) -> Callable[[str], float]:
    """A float above 0 (or, ``at_least_zero``, not below it); NaN is refused either way."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = -1.0
        if not (v >= 0 if at_least_zero else v > 0):
            raise ValueError(message)
        return v
    return parse


seconds = number(False, "give a positive number of seconds")
positive = number(False, "must be a positive number")
nonnegative = number(True, "must be a number >= 0")


def choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = text.strip().lower()
        if t not in choices:
            raise ValueError(f"valid choices: {', '.join(choices)}")
        return t
    return parse


def debug_name(text: str) -> str:
    t = text.strip().upper()
    if t not in DEBUG_LEVELS:
        raise ValueError("must be WARN, INFO or TRACE")
    return t


def stripped(text: str) -> str:
    return text.strip()


def secret_text(text: str) -> str:
    if not text:
        raise ValueError("is set but empty; set it to a long random string on every rank, "
                         "or unset it")
    return text


# -- how a value is shown (``polycast config``, the generated page, another process's env) --
def size_shown(value) -> str:
    return "" if value is None else format_size(value)


def secret_shown(value) -> str:
    return "(set)" if value else "(unset)"


def as_text(value) -> str:
    """A value as its variable spells it (booleans 1/0, whole floats without ".0")."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
