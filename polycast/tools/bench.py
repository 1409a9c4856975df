"""The launcher side of ``polycast bench``: start local ranks running :mod:`.bench_rank`
and collect the rows they print (the CLI checks a user's arguments first,
:mod:`polycast.cli.bench`; ``polycast tune --calibrate`` measures through here too)."""

from __future__ import annotations

import io
import json
import threading

from ..collectives import Collective
from ..errors import InvalidArgument, PolycastError
from ..units import format_size
from .launch import launch


class _Sink(io.RawIOBase):
    """Collects the ranks' forwarded output: rows and progress from rank 0."""

    def __init__(self, progress) -> None:
        self.rows: list[dict] = []
        self.errors: list[dict] = []
        self.other: list[str] = []
        self._progress = progress
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        line = bytes(data).decode("utf-8", "replace").rstrip("\n")
        body = line.split("] ", 1)[1] if line.startswith("[rank ") else line
        with self._lock:
            if body.startswith("BENCHROW "):
                self.rows.append(json.loads(body[9:]))
            elif body.startswith("BENCHERROR "):
                self.errors.append(json.loads(body[11:]))
            elif body.startswith("BENCHPROGRESS "):
                done, total = (int(x) for x in body.split()[1:3])
                self._progress(done, total)
            else:
                self.other.append(line)
        return len(data)


def measure(collective, nranks: int, algos: list[str], sizes: list[int], *, iters: int = 20,
            warmup: int = 5, dtype: str = "float32", op: str = "sum", root: int = 0,
            check: bool = True, transport: str | None = None, timeout_seconds: float = 900,
            progress=None, nonblocking: bool = False) -> list[dict]:
    """Launch ``nranks`` local ranks running :mod:`.bench_rank` and return its rows (dicts
    with ``collective, algorithm, nranks, nbytes, count, dtype, time_us, algbw, busbw,
    correct, transport``); raises :class:`PolycastError` naming the algorithm and size that
    failed, with the ranks' last output. The arguments are checked by the caller
    (:func:`polycast.cli.bench.measure` checks a user's)."""
    if not sizes:
        raise InvalidArgument("no sizes to measure")
    coll = Collective.parse(collective)
    sink = _Sink(progress or (lambda done, total: None))
    cmd = ["-m", "polycast.tools.bench_rank", str(coll), "--algo", ",".join(algos),
           "--sizes", ",".join(map(str, sizes)), "--iters", str(iters),
           "--warmup", str(warmup), "--dtype", dtype, "--op", op,
           "--root", str(root)] + ([] if check else ["--no-check"]) + (
               ["--nonblocking"] if nonblocking else [])
    extra = {"POLYCAST_TRANSPORT": transport} if transport else {}
    status = launch(nranks, cmd, extra_env=extra, stdout=sink, timeout_seconds=timeout_seconds)
    if sink.errors or status != 0:
        what = "; ".join(f"{e['algorithm']} at {format_size(e['nbytes'])}: {e['error']}"
                         for e in sink.errors)
        tail = "\n".join(sink.other[-20:])
        raise PolycastError(f"{coll} benchmark failed (exit status {status})"
                            + (f": {what}" if what else "") + (f"\n{tail}" if tail else ""))
    return sink.rows
