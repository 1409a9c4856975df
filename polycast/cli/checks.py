"""Argument checks every ``polycast`` command runs before it starts any work.

The rule for the whole CLI: bad input is one line on stderr (``polycast CMD: error: ...``)
and exit status 2, before ranks start, schedules are built or a simulation runs. argparse's
own errors follow it too (:class:`Parser`). Commands call these helpers first thing in their
``func``; anything they raise is an :class:`~polycast.errors.InvalidArgument`, which
``polycast.cli.main`` turns into that one line.

Sizes: a size smaller than one element per rank is an error; a size that does not split
into whole elements per rank is rounded down to one that does (as nccl-tests does) and a
note on stderr says so.
"""

from __future__ import annotations

import argparse
import sys

from ..algorithms import algorithms, get
from ..algorithms.estimate import check as check_schedule_size
from ..collectives import Collective, parse_dtype
from ..errors import InvalidArgument, UnknownName
from ..units import format_size, parse_size


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def probability(name: str, value: float) -> float:
    if not 0 <= value < 1:
        raise InvalidArgument(f"{name} must be a probability in [0, 1), got {value!r}")
    return value


def root(collective: Collective, value: int, nranks: int) -> int:
    if not isinstance(value, int) or not 0 <= value < nranks:
        raise InvalidArgument(f"--root {value} is out of range: with {nranks} ranks the root "
                              f"is one of 0..{nranks - 1}")
    return value


def names(text: str, what: str) -> list[str]:
    out = [a.strip() for a in text.split(",") if a.strip()]
    if not out:
        raise InvalidArgument(f"no {what} in {text!r}")
    return out


def algorithm_names(collective: Collective, wanted: list[str], nranks: int | None = None,
                    allow_auto: bool = False, options: dict | None = None) -> list[str]:
    """Every name must be an algorithm of ``collective`` (and run on ``nranks``)."""
    known = [a.name for a in algorithms(collective)]
    for name in wanted:
        if allow_auto and name == "auto":
            continue
        if name not in known:
            raise UnknownName(f"algorithm for {collective}", name,
                              known + (["auto"] if allow_auto else []))
        if nranks is not None:
            reason = get(collective, name).unsupported_reason(nranks, options)
            if reason:
                ok = [a for a in known if
                      get(collective, a).unsupported_reason(nranks, options) is None]
                raise InvalidArgument(f"{collective} algorithm {name!r} {reason}, not "
                                      f"{nranks}; valid for {nranks} ranks: "
                                      f"{', '.join(ok) or 'none'}")
    return wanted


def sized(collective: Collective, nranks: int, size, dtype: str, notes: list[str]
          ) -> tuple[int, int]:
    """(count, nbytes) for a size given on the command line (see the module docstring).
    A rounding is added to ``notes``, for :func:`print_notes` once every check passed."""
    nbytes = parse_size(size)
    itemsize = parse_dtype(dtype).itemsize
    if collective is Collective.BARRIER or nbytes == 0:
        return 0, 0
    unit = collective.total_elements(nranks, 1) * itemsize
    if nbytes < unit:
        raise InvalidArgument(
            f"{collective} of {format_size(nbytes)} over {nranks} ranks is less than one "
            f"{itemsize}-byte {dtype} element per rank: the smallest size is {_bytes(unit)}, "
            "and sizes are multiples of it")
    count = nbytes // unit
    if count * unit != nbytes:
        notes.append(f"{collective} of {format_size(nbytes)} does not split into whole "
                     f"{dtype} elements over {nranks} ranks; using {_bytes(count * unit)}, "
                     f"the next smaller multiple of {unit} B")
    return count, count * unit


def print_notes(command: str, notes: list[str]) -> None:
    for note in notes:
        print(f"polycast {command}: note: {note}", file=sys.stderr)


def schedule_fits(collective: Collective, algorithm: str, nranks: int, nchunks: int = 1,
                  channels: int = 1, compact: bool = False, **options) -> None:
    """Refuse (TooLarge) a schedule that would not fit in memory; see algorithms.estimate
    (``compact``: held as the simulator's fast path holds it)."""
    if algorithm != "auto":
        check_schedule_size(collective, algorithm, nranks, nchunks, channels, compact,
                            **options)


def _bytes(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n} B (~{n / 2**20:.2f} MiB)"


def output_path(path: str | None, option: str, extensions: tuple[str, ...] = ()) -> None:
    """A file the command will write at the end: its folder must exist and be writable,
    and its extension be one the writer knows — found now, not after the work."""
    import os
    if path is None:
        return
    if extensions and not path.lower().endswith(extensions):
        raise InvalidArgument(f"{option} {path!r}: the file name must end in one of "
                              f"{', '.join(extensions)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidArgument(f"{option} {path!r}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InvalidArgument(f"{option} {path!r}: folder {folder} is not writable")


def output_dir(path: str, option: str) -> None:
    """A folder the command will write files into: it exists (or its parent does, to be
    made) and is writable -- found now, not after the work."""
    import os
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        raise InvalidArgument(f"{option} {path!r} is a file, not a folder")
    probe = full if os.path.isdir(full) else os.path.dirname(full)
    if not os.path.isdir(probe):
        raise InvalidArgument(f"{option} {path!r}: folder {probe} does not exist")
    if not os.access(probe, os.W_OK):
        raise InvalidArgument(f"{option} {path!r}: folder {probe} is not writable")


def algorithm_options(collective: Collective, names: list[str], options: dict) -> dict:
    """``--opt KEY=VALUE`` pairs: each an option of every algorithm named, counts >= 1."""
    for name in names:
        takes = get(collective, name).options
        unknown = sorted(set(options) - set(takes))
        if unknown:
            raise InvalidArgument(f"{collective} {name} takes no option(s) {unknown}; its "
                                  f"options: {', '.join(takes) or 'none'}")
    for key in ("roots", "hosts", "ranks_per_host"):
        if key in options:
            positive_int(key, options[key])
    return options
