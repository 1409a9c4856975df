"""POLYCAST_* environment variables read on a call's hot path.

Users and tests change them mid-process (``monkeypatch.setenv``, ``os.environ[...] = ...``),
so a call reads them again every time rather than once at import. ``os.environ.get``
encodes the name and decodes the value in Python (~0.6 us a read, several reads a call);
:func:`raw` looks the name up in the same store ``os.environ`` keeps (its bytes mapping on
POSIX, which every ``os.environ`` write updates) for ~0.05 us, and :func:`get` decodes only
a value that is set."""

from __future__ import annotations

import os

_KEYS: dict[str, bytes] = {}


def key(name: str) -> bytes | str:
    """The name as ``os.environ``'s store keys it (what :func:`raw` looks up)."""
    if getattr(os.environ, "_data", None) is None or os.name != "posix":
        return name
    k = _KEYS.get(name)
    if k is None:
        k = _KEYS[name] = os.fsencode(name)
    return k


def raw(name: str) -> bytes | str | None:
    """The variable's value as ``os.environ`` stores it (bytes on POSIX), or None: cheap
    enough for a per-call cache key. Equal values mean equal ``os.environ.get`` results."""
    data = getattr(os.environ, "_data", None)
    if data is None or os.name != "posix":      # not CPython's POSIX os.environ: ask it
        return os.environ.get(name)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = os.fsencode(name)
    return data.get(key)


def get(name: str, default: str | None = None) -> str | None:
    """``os.environ.get(name, default)``, cheaper."""
    v = raw(name)
    if v is None:
        return default
    return v if isinstance(v, str) else os.fsdecode(v)


_ALGO_VARS: dict = {}


def algorithm_var(coll) -> str:
    """The variable that picks ``coll``'s algorithm (a Collective): POLYCAST_<COLLECTIVE>_ALGO."""
    name = _ALGO_VARS.get(coll)
    if name is None:
        name = _ALGO_VARS[coll] = f"POLYCAST_{coll.name}_ALGO"
    return name


def algorithm(coll) -> str | None:
    """POLYCAST_<COLLECTIVE>_ALGO for ``coll``, or None when it is not set."""
    return get(algorithm_var(coll))
