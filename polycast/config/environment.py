"""Reading the configuration: from the environment once, where a job, a communicator or a
command is made (:func:`load`, :func:`current`), or from an :func:`override` around that
code. A bad value is a one-line InvalidArgument naming the variable; an unknown
``POLYCAST_*`` name is warned about once, naming the nearest known one; a retired switch is
refused with what replaces it; at POLYCAST_DEBUG=INFO each set variable is logged once."""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
import threading
import warnings
from typing import Any, Iterator, Mapping

from ..collectives import Collective
from ..errors import InvalidArgument
from .params import (ALGO_VARS, BY_VAR, HOOKS_VAR, JOB_VARIABLES, PREFIX, RETIRED, Config,
                     known_variables)

_lock = threading.Lock()
_logged: set = set()
_warned: set = set()
_overrides: list[Config] = []


def load(env: Mapping[str, str] | None = None, *, rank: int | None = None) -> Config:
    """The configuration the environment ``env`` (default ``os.environ``) asks for:
    every set variable parsed and validated (InvalidArgument naming it and what it accepts),
    an unknown ``POLYCAST_*`` name warned about once, and at POLYCAST_DEBUG=INFO each set
    variable logged once (prefixed with ``rank`` when given)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    algos = []
    seen = []
    for var, text in env.items():
        if not var.startswith(PREFIX):
            continue
        f = BY_VAR.get(var)
        if f is not None:
            if text == "" and f.name not in ("hooks", "secret"):
                seen.append((var, text))        # set but empty: the default, as before
                continue
            try:
                values[f.name] = f.metadata["parse"](text)
            except ValueError as exc:
                raise InvalidArgument(f"{var}={text!r}: {exc}") from None
            seen.append((var, text))
        elif var in ALGO_VARS:
            if text.strip():
                algos.append((ALGO_VARS[var], text.strip().lower()))
                seen.append((var, text))
        elif var in RETIRED:
            now = RETIRED[var]
            raise InvalidArgument(f"{var}={text!r}: no longer a setting; " + (
                f"a test hook now: {now}" if now.startswith(HOOKS_VAR) else f"now: {now}"))
        elif var not in JOB_VARIABLES:
            _warn_unknown(var)
    if algos:
        values["algorithms"] = tuple(sorted(algos, key=lambda a: list(Collective).index(a[0])))
    cfg = Config(sources=tuple((var, "environment") for var, _ in seen), **values)
    if cfg.debug_level >= 1:
        _log_set(seen, rank)
    return cfg


def _warn_unknown(var: str) -> None:
    with _lock:
        if var in _warned:
            return
        _warned.add(var)
    near = difflib.get_close_matches(var, known_variables(), n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near else "; `polycast config` lists them"
    warnings.warn(f"polycast: {var} is not a polycast variable{hint}", RuntimeWarning,
                  stacklevel=3)


def _log_set(seen, rank) -> None:
    tag = f"[rank {rank}] " if rank is not None else ""
    for var, text in seen:
        with _lock:
            if (var, text) in _logged:
                continue
            _logged.add((var, text))
        shown = "(set)" if var == "POLYCAST_SECRET" else text
        print(f"{tag}polycast INFO {var}={shown}", file=sys.stderr, flush=True)


def read_var(var: str, env: Mapping[str, str] | None = None):
    """One variable's value in ``env`` (default ``os.environ``), parsed and validated as
    :func:`load` does, or its default: for a launcher or a tool that needs one setting of
    the processes it starts."""
    env = os.environ if env is None else env
    f = BY_VAR[var]
    text = env.get(var)
    if text is None or text == "" and f.name not in ("hooks", "secret"):
        return f.default
    try:
        return f.metadata["parse"](text)
    except ValueError as exc:
        raise InvalidArgument(f"{var}={text!r}: {exc}") from None


def current(*, rank: int | None = None) -> Config:
    """The configuration a job, a communicator or a command made now takes: the innermost
    :func:`override`, else the environment's (:func:`load`). Call it where such a thing is
    made, once, and hand the result down."""
    with _lock:
        if _overrides:
            return _overrides[-1]
    return load(rank=rank)


@contextlib.contextmanager
def override(**changes) -> Iterator[Config]:
    """Within the block, :func:`current` is the current configuration with ``changes``
    (field names; ``hooks={"native": False}`` changes hooks): tests and programs set
    parameters this way instead of changing ``os.environ`` under running code. Objects
    made before the block keep the configuration they took."""
    cfg = current().replace("override", **changes)
    with _lock:
        _overrides.append(cfg)
    try:
        yield cfg
    finally:
        with _lock:
            _overrides.remove(cfg)


def reset_logged() -> None:
    """Forget which variables were logged and warned about (tests)."""
    with _lock:
        _logged.clear()
        _warned.clear()

