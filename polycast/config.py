"""polycast's configuration: every ``POLYCAST_*`` parameter, typed, validated and documented
in one frozen dataclass, read from the environment once.

When a job or a communicator is made (``polycast.init()``, a polycast.torch process group,
the offload process, a CLI command) it takes a :class:`Config` -- :func:`current`: the
innermost :func:`override`, else the environment read then -- and hands it down: Comm,
dispatch, driver, symmetric memory and offload take their settings from it and never read
the environment again, so a variable set later changes nothing for a communicator that
exists (NCCL reads each parameter once the same way). A bad value is a one-line
:class:`~polycast.errors.InvalidArgument` naming the variable and what it accepts; a set
``POLYCAST_*`` name polycast does not know gets a warning naming the nearest known one;
with ``POLYCAST_DEBUG=INFO`` each variable that is set is logged once.
``polycast config`` prints the effective settings and where each came from;
docs/configuration.md is generated from this module (``polycast config --markdown``).

Test hooks: ``POLYCAST_TEST_HOOKS="native=0,replay=0"`` switches implementations so tests
and benchmarks can compare paths in one run (:class:`Hooks`). They are not settings for
users; rank processes a test starts inherit the variable like any other.

To add a parameter: a field here with :func:`_param` (variable, doc, parser), then read it
from the Config the code is handed (``comm.config``, ``driver.config``...), never from the
environment; regenerate the doc (``polycast config --markdown > docs/configuration.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from .collectives import Collective
from .errors import InvalidArgument
from .units import format_size, parse_size

PREFIX = "POLYCAST_"
HOOKS_VAR = "POLYCAST_TEST_HOOKS"
DEBUG_LEVELS = {"": 0, "WARN": 0, "INFO": 1, "TRACE": 2}


# -- parsers: text -> value, or ValueError saying what is accepted ---------------------------
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


def _int(lo: int, hi: int | None = None, what: str = "an integer", note: str = ""
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


def _nbytes(lo: int, least: str | None = None) -> Callable[[str], int]:
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


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise ValueError("give a positive number of seconds")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise ValueError("must be a positive number")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v >= 0:
        raise ValueError("must be a number >= 0")
    return v


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = text.strip().lower()
        if t not in choices:
            raise ValueError(f"valid choices: {', '.join(choices)}")
        return t
    return parse


def _debug(text: str) -> str:
    t = text.strip().upper()
    if t not in DEBUG_LEVELS:
        raise ValueError("must be WARN, INFO or TRACE")
    return t


def _text(text: str) -> str:
    return text.strip()


def _param(var: str, default: Any, doc: str, parse: Callable[[str], Any], *,
           show: Callable[[Any], str] | None = None) -> Any:
    """A field read from ``var``: ``parse`` turns its text into the value or raises
    ValueError saying what it accepts; ``doc`` is its one line in docs/configuration.md."""
    return field(default=default, metadata={"var": var, "doc": doc, "parse": parse,
                                            "show": show})


def _size_shown(value) -> str:
    return "" if value is None else format_size(value)


def _secret(text: str) -> str:
    if not text:
        raise ValueError("is set but empty; set it to a long random string on every rank, "
                         "or unset it")
    return text


def _secret_shown(value) -> str:
    return "(set)" if value else "(unset)"


# -- test hooks --------------------------------------------------------------------------------
def _hook(default, doc: str):
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Hooks:
    """Switches that exist to compare implementations in tests and benchmarks, set by
    ``POLYCAST_TEST_HOOKS`` as ``name=value`` pairs separated by commas (booleans take
    1/0). Not for users: the defaults are what polycast is."""

    native: bool = _hook(True, "the compiled shared-memory ring hot path (when built)")
    dgram: bool = _hook(True, "the compiled multicast datagram path (when built): reads, "
                              "checks and places received chunks in C")
    replay: bool = _hook(True, "the compiled replay of repeated calls")
    cma: bool = _hook(True, "single-copy reads between local ranks (process_vm_readv)")
    cma_pull: bool = _hook(True, "large local messages pulled by the receiver (else RTS/CTS)")
    futex: bool = _hook(True, "futex sleeps and wake-ups between local ranks (0: the wait "
                              "policy naps, the rings ring doorbells)")
    wait_busy_us: float = _hook(3.0, "a waiter looks without yielding this long first (the "
                                     "wait policy, runtime/transport/wait.py)")
    wait_yield_wall_us: float = _hook(1000.0, "a waiter's yielding is bounded by this much "
                                              "wall time, then it sleeps")
    replay_step_limit: int = _hook(-1, ">= 0: every replay stops after this many steps")
    replay_wait_us: float = _hook(2000.0, "a replay with no input for this long hands over")
    cprofile: str = _hook("", "cProfile each progress thread into the file PATH.RANK")

    @classmethod
    def parse(cls, text: str) -> "Hooks":
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in kinds:
                raise ValueError(f"{item!r} is not name=value with a name among "
                                 f"{', '.join(kinds)}")
            kind = kinds[name]
            try:
                values[name] = (parse_bool(value) if kind == "bool" else
                                int(value) if kind == "int" else
                                float(value) if kind == "float" else value.strip())
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a {kind}") from None
        return cls(**values)

    def describe(self) -> str:
        """The hooks that differ from the defaults, as POLYCAST_TEST_HOOKS spells them."""
        default = Hooks()
        out = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v != getattr(default, f.name):
                out.append(f"{f.name}={int(v) if isinstance(v, bool) else v}")
        return ",".join(out)


# -- the configuration ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """Every parameter, with its default. Made by :func:`load` (from the environment) or
    :meth:`replace`; validated on construction."""

    # the job's communication
    transport: str = _param(
        "POLYCAST_TRANSPORT", "auto", "between ranks of one host: shared-memory rings "
        "(shm, with TCP beside them for control), TCP only (tcp), or shm where it can (auto)",
        _choice("auto", "shm", "tcp"))
    timeout_seconds: float = _param(
        "POLYCAST_TIMEOUT", 60.0, "every wait is bounded by this many seconds: a call, "
        "the rendezvous, a connect", _seconds)
    progress: str = _param(
        "POLYCAST_PROGRESS", "thread", "who carries a rank's communication: a thread of "
        "its own (thread) or the host's offload process (offload)",
        _choice("thread", "offload"))
    secret: str | None = _param(
        "POLYCAST_SECRET", None, "the job's key: every message and datagram carries a MAC "
        "under it, and the rendezvous is authenticated (set it to the same long random "
        "string on every rank; `polycast run --secret` makes one)", _secret,
        show=_secret_shown)
    mtu_nbytes: int | None = _param(
        "POLYCAST_MTU", None, "largest multicast datagram payload in bytes (default: what "
        "one datagram of the job's network carries)", _int(64, 65000))
    pacing_gbps: float | None = _param(
        "POLYCAST_PACING_GBPS", None, "pace multicast sends at this many Gbit/s "
        "(default: no pacing)", _positive_float)
    mcast_interface: str = _param(
        "POLYCAST_MCAST_IF", "", "IPv4 address of the interface multicast uses (default: "
        "loopback on one host, else the one the group's route takes)", _text)
    faults: str = _param(
        "POLYCAST_FAULTS", "", "inject faults where multicast datagrams are read, e.g. "
        "loss=0.1,dup=0.05,reorder=0.2,replay=0.02,seed=7 (runtime/transport/faults.py)",
        _text)
    shm_ring_nbytes: int = _param(
        "POLYCAST_SHM_RING_NBYTES", 8 << 20, "bytes of each shared-memory ring between two "
        "ranks of a host (one per direction)", _nbytes(1 << 16), show=_size_shown)
    cma_min_nbytes: int = _param(
        "POLYCAST_CMA_MIN_NBYTES", 512 << 10, "messages between ranks of a host of at least "
        "this many bytes are read single-copy from the sender's memory", _nbytes(1),
        show=_size_shown)
    eager_max_nbytes: int | None = _param(
        "POLYCAST_EAGER_MAX_NBYTES", None, "messages up to this many bytes go eager, larger "
        "ones by rendezvous, to every peer (default: 256 KiB, 1 MiB on shared-memory rings)",
        _nbytes(0), show=_size_shown)
    max_early_nbytes: int | None = _param(
        "POLYCAST_MAX_EARLY_NBYTES", None, "bytes a rank holds for calls it has not posted "
        "yet (default 64 MiB)", _nbytes(0), show=_size_shown)
    host_id: str = _param(
        "POLYCAST_HOST_ID", "", "this process's host identity among the job's hosts "
        "(default: hostname, boot id and network namespace); e.g. to force TCP between "
        "ranks of one machine, or to group ranks that share /dev/shm across namespaces",
        _text)
    wait_spin_us: float = _param(
        "POLYCAST_WAIT_SPIN_US", 50.0, "how much of its own CPU time, in microseconds, a "
        "rank waiting for its peers spends watching for them (yielding the core between "
        "looks) before it sleeps until woken; 0: sleep at once (ranks that share their "
        "cores with other work: more ranks than cores, data-loader or compute threads)",
        _nonneg_float)
    gil_switch_us: float = _param(
        "POLYCAST_SWITCH_US", 100.0, "the interpreter's GIL switch interval while a "
        "communication thread runs beside the caller's code, in microseconds (0: leave it "
        "alone)", _nonneg_float)
    # which path and algorithm a call takes
    symm: bool = _param(
        "POLYCAST_SYMM", True, "auto may run calls on one host through symmetric memory "
        "(0: engine schedules only)", parse_bool)
    nchunks: int | None = _param(
        "POLYCAST_NCHUNKS", None, "pipeline every call in this many chunks per part instead "
        "of the planner's choice (experiments, calibration)",
        _int(1, what="a positive integer"))
    algorithms: tuple = field(default=(), metadata={
        "var": "POLYCAST_<COLLECTIVE>_ALGO", "doc": "the algorithm a collective runs when a "
        "call does not name one (e.g. POLYCAST_ALLGATHER_ALGO=ring; auto: the planner's "
        "choice); `polycast algos` lists them", "parse": None, "show": None})
    max_schedule_gib: float = _param(
        "POLYCAST_MAX_SCHEDULE_GIB", 4.0, "refuse to build a schedule estimated to need more "
        "memory than this many GiB", _positive_float)
    profile_path: str = _param(
        "POLYCAST_PROFILE", "", "the calibration profile the planner reads and `polycast "
        "tune --calibrate` writes (default: ~/.cache/polycast/profile.json)", _text)
    debug: str = _param(
        "POLYCAST_DEBUG", "", "INFO: log each set variable once and each choice the first "
        "time; TRACE: every call's choice too (stderr)", _debug)
    # the offload process
    offload_workers: int = _param(
        "POLYCAST_OFFLOAD_WORKERS", 1, "worker processes that receive multicast for the "
        "offload process (0: it receives multicast itself)",
        _int(0, 64, "an integer", " (0: the offload process receives multicast itself)"))
    offload_arena_nbytes: int = _param(
        "POLYCAST_OFFLOAD_ARENA", 1 << 30, "bytes of registered memory per rank under "
        "progress=offload (sparse)", _nbytes(1 << 20, "1 MiB (default 1 GiB)"),
        show=_size_shown)
    offload_staging: bool = _param(
        "POLYCAST_OFFLOAD_STAGING", True, "under progress=offload, copy a buffer that is not "
        "registered memory in and out (0: refuse it)", parse_bool)
    # the simulator and the lab
    nic_host_file: str = _param(
        "POLYCAST_NIC_HOST_FILE", "", "the measured host NIC preset the simulator's `host` "
        "NIC model reads (default: the one polycast ships)", _text)
    lab_state_dir: str = _param(
        "POLYCAST_LAB_STATE_DIR", "/run/polycast-lab", "where `polycast lab` keeps the state "
        "of the labs it brought up", _text)
    sources: tuple = field(default=(), compare=False, repr=False, metadata={"var": None})
    hooks: Hooks = field(default_factory=Hooks, metadata={
        "var": HOOKS_VAR, "doc": "test hooks (not for users): name=value pairs, see "
        "polycast.config.Hooks", "parse": Hooks.parse,
        "show": lambda h: h.describe() or "(none)"})

    def __post_init__(self) -> None:
        for f in _PARAMS:
            parse = f.metadata.get("parse")
            value = getattr(self, f.name)
            if parse is None or value is None or value == f.default or f.name == "hooks":
                continue
            try:
                parse(_as_text(value))
            except ValueError as exc:
                raise InvalidArgument(f"{f.metadata['var']}={value!r}: {exc}") from None

    # -- reading -------------------------------------------------------------------------------
    def algorithm(self, coll: Collective) -> str | None:
        """POLYCAST_<COLL>_ALGO's value for ``coll`` (lower case), or None."""
        for c, name in self.algorithms:
            if c is coll:
                return name
        return None

    @property
    def debug_level(self) -> int:
        return DEBUG_LEVELS[self.debug]

    @property
    def max_schedule_nbytes(self) -> float:
        return self.max_schedule_gib * 2**30

    def replace(self, origin: str = "argument", **changes) -> "Config":
        """A copy with ``changes`` (field names; ``hooks`` may be a dict of hook changes;
        None values are left out), each recorded as coming from ``origin``."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if isinstance(changes.get("hooks"), dict):
            changes["hooks"] = dataclasses.replace(self.hooks, **changes["hooks"])
        if isinstance(changes.get("algorithms"), dict):
            merged = dict(self.algorithms)
            merged.update({Collective.parse(c): n.lower()
                           for c, n in changes["algorithms"].items()})
            changes["algorithms"] = tuple((c, merged[c]) for c in Collective if c in merged)
        unknown = set(changes) - {f.name for f in _PARAMS}
        if unknown:
            raise InvalidArgument(f"unknown configuration field(s) {sorted(unknown)}")
        if not changes:
            return self
        for name, value in changes.items():
            parse = _FIELD[name].metadata["parse"]
            if name not in ("hooks", "algorithms") and parse is not None:
                try:
                    parse(_as_text(value))
                except ValueError as exc:
                    what = (f"{name}={value!r} (or {_VAR_OF[name]})" if origin == "argument"
                            else f"{_VAR_OF[name]}={value!r}")
                    raise InvalidArgument(f"{what}: {exc}") from None
        vars_ = {_VAR_OF[name] for name in changes}
        sources = tuple((v, o) for v, o in self.sources if v not in vars_) + \
            tuple((v, origin) for v in sorted(vars_))
        return dataclasses.replace(self, sources=sources, **changes)

    def source(self, var: str) -> str:
        """Where ``var``'s value came from: "environment", "argument", "override" or
        "default"."""
        return dict(self.sources).get(var, "default")

    def is_set(self, name: str) -> bool:
        """Whether field ``name`` was set (by the environment, an argument or an
        override) rather than left at its default."""
        return _VAR_OF[name] in dict(self.sources)

    def to_env(self) -> dict[str, str]:
        """The variables that give another process this configuration (the ones not at
        their defaults), e.g. for the offload process or ranks a test starts."""
        out = {}
        for f in _PARAMS:
            value = getattr(self, f.name)
            if f.name == "algorithms":
                out.update({algorithm_var(c): n for c, n in value})
            elif f.name == "hooks":
                if value.describe():
                    out[HOOKS_VAR] = value.describe()
            elif value != f.default and value is not None:
                out[f.metadata["var"]] = _as_text(value)
        return out

    def settings(self) -> list[tuple[str, str, str]]:
        """(variable, value, where it came from) for every parameter (``polycast
        config``)."""
        sources = dict(self.sources)
        out = []
        for f in _PARAMS:
            var, value = f.metadata["var"], getattr(self, f.name)
            if f.name == "algorithms":
                for c in Collective:
                    v = self.algorithm(c)
                    name = algorithm_var(c)
                    out.append((name, v or "auto", sources.get(name, "default")))
                continue
            show = f.metadata.get("show")
            text = show(value) if show else ("" if value is None else _as_text(value))
            out.append((var, text or "(unset)", sources.get(var, "default")))
        return out


def _as_text(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def algorithm_var(coll: Collective) -> str:
    return f"{PREFIX}{coll.name}_ALGO"


_ALGO_VARS = {algorithm_var(c): c for c in Collective}

# Set by the launchers, read by runtime/bootstrap/env.py once when the job is joined: where
# this process sits in the job (not settings; documented and known, so no warning).
JOB_VARIABLES = {
    "POLYCAST_RANK": "this process's rank (polycast run sets it, as the other POLYCAST_ "
                     "job variables)",
    "POLYCAST_SIZE": "the number of ranks",
    "POLYCAST_LOCAL_RANK": "this process's rank among the ranks of its host",
    "POLYCAST_LOCAL_SIZE": "the number of ranks on this host",
    "POLYCAST_MASTER_ADDR": "the rendezvous store's address",
    "POLYCAST_MASTER_PORT": "the rendezvous store's port",
    "POLYCAST_JOB_ID": "the job's identity (multicast groups and shared memory are per job)",
    "POLYCAST_RUN_REPORT": "where a rank that fails writes its report for the launcher",
    "POLYCAST_LAB_MARKS": "`polycast lab run --marks`: where ranks write counter marks",
}

# Retired names: a set one is refused with what replaces it (once they were settings).
RETIRED = {f"{PREFIX}{name.upper()}": f"{HOOKS_VAR}={name}=0" for name in
           ("native", "replay", "cma", "cma_pull", "futex")}
RETIRED.update({f"{PREFIX}{name.upper()}": f"{HOOKS_VAR}={name}=..." for name in
                ("replay_step_limit", "replay_wait_us")})
# The spin and wait knobs of each waiter: one wait policy now (runtime/transport/wait.py).
RETIRED.update({f"{PREFIX}{name.upper()}": "POLYCAST_WAIT_SPIN_US (one wait policy; "
                f"{HOOKS_VAR}=wait_busy_us=...,wait_yield_wall_us=... for tests)" for name in
                ("drive_spin_us", "drive_spin_wall_us", "spin_us", "replay_spin_us",
                 "replay_spin_wall_us")})


_PARAMS = [f for f in dataclasses.fields(Config) if f.metadata.get("var")]
_BY_VAR = {f.metadata["var"]: f for f in _PARAMS if f.name != "algorithms"}
_VAR_OF = {f.name: f.metadata["var"] for f in _PARAMS}
_FIELD = {f.name: f for f in _PARAMS}


def known_variables() -> list[str]:
    return sorted(set(_BY_VAR) | set(_ALGO_VARS) | set(JOB_VARIABLES))


# -- reading the environment ----------------------------------------------------------------------
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
        f = _BY_VAR.get(var)
        if f is not None:
            if text == "" and f.name not in ("hooks", "secret"):
                seen.append((var, text))        # set but empty: the default, as before
                continue
            try:
                values[f.name] = f.metadata["parse"](text)
            except ValueError as exc:
                raise InvalidArgument(f"{var}={text!r}: {exc}") from None
            seen.append((var, text))
        elif var in _ALGO_VARS:
            if text.strip():
                algos.append((_ALGO_VARS[var], text.strip().lower()))
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
    f = _BY_VAR[var]
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


# -- the generated page ------------------------------------------------------------------------
def markdown() -> str:
    """docs/configuration.md: every parameter, generated from :class:`Config`."""
    lines = ["# Configuration", "",
             "<!-- Generated from polycast/config.py by `polycast config --markdown > "
             "docs/configuration.md`; tests/test_config.py fails when it is stale. -->", "",
             "polycast reads its `POLYCAST_*` variables once, when a job or communicator is "
             "made, and hands them down; setting one later changes nothing for a "
             "communicator that exists. A bad value is an error naming the variable; an "
             "unknown `POLYCAST_*` name is warned about. `polycast config` prints the "
             "effective settings and where each came from; `POLYCAST_DEBUG=INFO` logs each "
             "set variable once. Booleans take 1/true/yes/on or 0/false/no/off; sizes take "
             "bytes or units (64KiB, 8MiB).", "",
             "| variable | default | what it does |", "|---|---|---|"]
    cfg = Config()
    for var, value, _ in cfg.settings():
        if var in _ALGO_VARS:
            continue
        f = _BY_VAR[var]
        if f.name == "hooks":
            continue
        lines.append(f"| `{var}` | {value} | {f.metadata['doc']} |")
    algo = next(f for f in _PARAMS if f.name == "algorithms")
    lines.append(f"| `POLYCAST_<COLLECTIVE>_ALGO` | auto | {algo.metadata['doc']}; "
                 f"collectives: {', '.join(c.name for c in Collective)} |")
    lines += ["", "## Set by the launcher", "",
              "`polycast run` sets these for each rank (torchrun's, mpiexec's and srun's own "
              "variables work too); they say where a process sits in the job.", "",
              "| variable | what it says |", "|---|---|"]
    lines += [f"| `{var}` | {doc} |" for var, doc in JOB_VARIABLES.items()]
    lines += ["", "## Test hooks", "",
              f"`{HOOKS_VAR}` takes `name=value` pairs separated by commas; they switch "
              "implementations so tests and benchmarks can compare paths in one run, and "
              "are not settings for users.", "", "| hook | default | what it switches |",
              "|---|---|---|"]
    for f in dataclasses.fields(Hooks):
        d = f.default
        lines.append(f"| `{f.name}` | {_as_text(d) if d != '' else '(unset)'} | "
                     f"{f.metadata['doc']} |")
    return "\n".join(lines) + "\n"
