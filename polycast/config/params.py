"""The parameter table: every ``POLYCAST_*`` parameter as a field of the frozen
:class:`Config` (its variable, default, parser and one-line doc), the test hooks
(:class:`Hooks`), and the other names polycast knows (the launcher's job variables, the
retired switches). Reading them from the environment is polycast.config.environment's;
the documentation page is generated from here (polycast.config.page).

To add a parameter: a field of :class:`Config` made with :func:`_param` (variable, default,
doc, a parser of polycast.config.parse), then read it from the Config the code is handed
(``comm.config``, ``driver.config``...), never from the environment; regenerate the doc
(``polycast config --markdown > docs/configuration.md``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ..collectives import Collective
from ..errors import InvalidArgument
from .parse import (DEBUG_LEVELS, as_text, byte_size, choice, debug_name, integer, nonnegative,
                    parse_bool, positive, seconds, secret_shown, secret_text, size_shown,
                    stripped)

PREFIX = "POLYCAST_"
HOOKS_VAR = "POLYCAST_TEST_HOOKS"


def _param(var: str, default: Any, doc: str, parse: Callable[[str], Any], *,
           show: Callable[[Any], str] | None = None) -> Any:
    """A field read from ``var``: ``parse`` turns its text into the value or raises
    ValueError saying what it accepts; ``doc`` is its one line in docs/configuration.md."""
    return field(default=default, metadata={"var": var, "doc": doc, "parse": parse,
                                            "show": show})


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
    wait_busy_us: float = _hook(3.0, "a symmetric-memory waiter whose ranks fit the host's "
                                     "cores looks without yielding this long first (the wait "
                                     "policy, runtime/transport/wait.py)")
    wait_yield_wall_us: float = _hook(200.0, "a waiter's yielding is bounded by this much "
                                              "wall time, then it sleeps")
    replay_step_limit: int = _hook(-1, ">= 0: every replay stops after this many steps")
    replay_wait_us: float = _hook(2000.0, "a replay with no input for this long hands over")
    cprofile: str = _hook("", "cProfile each progress thread into the file PATH.RANK")
    sim_native: bool = _hook(True, "the simulator's compiled network model (when built; "
                                   "polycast/sim/network.py)")

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
        choice("auto", "shm", "tcp"))
    timeout_seconds: float = _param(
        "POLYCAST_TIMEOUT", 60.0, "every wait is bounded by this many seconds: a call, "
        "the rendezvous, a connect", seconds)
    progress: str = _param(
        "POLYCAST_PROGRESS", "thread", "who carries a rank's communication: a thread of "
        "its own (thread) or the host's offload process (offload)",
        choice("thread", "offload"))
    secret: str | None = _param(
        "POLYCAST_SECRET", None, "the job's key: every message and datagram carries a MAC "
        "under it, and the rendezvous is authenticated (set it to the same long random "
        "string on every rank; `polycast run --secret` makes one)", secret_text,
        show=secret_shown)
    mtu_nbytes: int | None = _param(
        "POLYCAST_MTU", None, "largest multicast datagram payload in bytes (default: what "
        "one datagram of the job's network carries)", integer(64, 65000))
    pacing_gbps: float | None = _param(
        "POLYCAST_PACING_GBPS", None, "pace multicast sends at this many Gbit/s "
        "(default: no pacing)", positive)
    mcast_interface: str = _param(
        "POLYCAST_MCAST_IF", "", "IPv4 address of the interface multicast uses (default: "
        "loopback on one host, else the one the group's route takes)", stripped)
    faults: str = _param(
        "POLYCAST_FAULTS", "", "inject faults where multicast datagrams are read, e.g. "
        "loss=0.1,dup=0.05,reorder=0.2,replay=0.02,seed=7 (runtime/transport/faults.py)",
        stripped)
    shm_ring_nbytes: int = _param(
        "POLYCAST_SHM_RING_NBYTES", 8 << 20, "bytes of each shared-memory ring between two "
        "ranks of a host (one per direction)", byte_size(1 << 16), show=size_shown)
    cma_min_nbytes: int = _param(
        "POLYCAST_CMA_MIN_NBYTES", 512 << 10, "messages between ranks of a host of at least "
        "this many bytes are read single-copy from the sender's memory", byte_size(1),
        show=size_shown)
    eager_max_nbytes: int | None = _param(
        "POLYCAST_EAGER_MAX_NBYTES", None, "messages up to this many bytes go eager, larger "
        "ones by rendezvous, to every peer (default: 256 KiB, 1 MiB on shared-memory rings)",
        byte_size(0), show=size_shown)
    max_early_nbytes: int | None = _param(
        "POLYCAST_MAX_EARLY_NBYTES", None, "bytes a rank holds for calls it has not posted "
        "yet (default 64 MiB)", byte_size(0), show=size_shown)
    host_id: str = _param(
        "POLYCAST_HOST_ID", "", "this process's host identity among the job's hosts "
        "(default: hostname, boot id and network namespace); e.g. to force TCP between "
        "ranks of one machine, or to group ranks that share /dev/shm across namespaces",
        stripped)
    wait_spin_us: float = _param(
        "POLYCAST_WAIT_SPIN_US", 50.0, "how much of its own CPU time, in microseconds, a "
        "rank waiting for its peers spends watching for them (yielding the core between "
        "looks) before it sleeps until woken; 0: sleep at once (ranks that share their "
        "cores with other work: more ranks than cores, data-loader or compute threads)",
        nonnegative)
    gil_switch_us: float = _param(
        "POLYCAST_SWITCH_US", 100.0, "the interpreter's GIL switch interval while a "
        "communication thread runs beside the caller's code, in microseconds (0: leave it "
        "alone)", nonnegative)
    # which path and algorithm a call takes
    symm: bool = _param(
        "POLYCAST_SYMM", True, "auto may run calls on one host through symmetric memory "
        "(0: engine schedules only)", parse_bool)
    nchunks: int | None = _param(
        "POLYCAST_NCHUNKS", None, "pipeline every call in this many chunks per part instead "
        "of the planner's choice (experiments, calibration)",
        integer(1, what="a positive integer"))
    algorithms: tuple = field(default=(), metadata={
        "var": "POLYCAST_<COLLECTIVE>_ALGO", "doc": "the algorithm a collective runs when a "
        "call does not name one (e.g. POLYCAST_ALLGATHER_ALGO=ring; auto: the planner's "
        "choice); `polycast algos` lists them", "parse": None, "show": None})
    max_schedule_gib: float = _param(
        "POLYCAST_MAX_SCHEDULE_GIB", 4.0, "refuse to build a schedule estimated to need more "
        "memory than this many GiB", positive)
    profile_path: str = _param(
        "POLYCAST_PROFILE", "", "the calibration profile the planner reads and `polycast "
        "tune --calibrate` writes (default: ~/.cache/polycast/profile.json)", stripped)
    debug: str = _param(
        "POLYCAST_DEBUG", "", "INFO: log each set variable once and each choice the first "
        "time; TRACE: every call's choice too (stderr)", debug_name)
    # the offload process
    offload_workers: int = _param(
        "POLYCAST_OFFLOAD_WORKERS", 1, "worker processes that receive multicast for the "
        "offload process (0: it receives multicast itself)",
        integer(0, 64, "an integer", " (0: the offload process receives multicast itself)"))
    offload_arena_nbytes: int = _param(
        "POLYCAST_OFFLOAD_ARENA", 1 << 30, "bytes of registered memory per rank under "
        "progress=offload (sparse)", byte_size(1 << 20, "1 MiB (default 1 GiB)"),
        show=size_shown)
    offload_staging: bool = _param(
        "POLYCAST_OFFLOAD_STAGING", True, "under progress=offload, copy a buffer that is not "
        "registered memory in and out (0: refuse it)", parse_bool)
    # the simulator and the lab
    nic_host_file: str = _param(
        "POLYCAST_NIC_HOST_FILE", "", "the measured host NIC preset the simulator's `host` "
        "NIC model reads (default: the one polycast ships)", stripped)
    lab_state_dir: str = _param(
        "POLYCAST_LAB_STATE_DIR", "/run/polycast-lab", "where `polycast lab` keeps the state "
        "of the labs it brought up", stripped)
    sources: tuple = field(default=(), compare=False, repr=False, metadata={"var": None})
    hooks: Hooks = field(default_factory=Hooks, metadata={
        "var": HOOKS_VAR, "doc": "test hooks (not for users): name=value pairs, see "
        "polycast.config.Hooks", "parse": Hooks.parse,
        "show": lambda h: h.describe() or "(none)"})

    def __post_init__(self) -> None:
        for f in PARAMS:
            parse = f.metadata.get("parse")
            value = getattr(self, f.name)
            if parse is None or value is None or value == f.default or f.name == "hooks":
                continue
            try:
                parse(as_text(value))
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
        unknown = set(changes) - {f.name for f in PARAMS}
        if unknown:
            raise InvalidArgument(f"unknown configuration field(s) {sorted(unknown)}")
        if not changes:
            return self
        for name, value in changes.items():
            parse = _FIELD[name].metadata["parse"]
            if name not in ("hooks", "algorithms") and parse is not None:
                try:
                    parse(as_text(value))
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
        for f in PARAMS:
            value = getattr(self, f.name)
            if f.name == "algorithms":
                out.update({algorithm_var(c): n for c, n in value})
            elif f.name == "hooks":
                if value.describe():
                    out[HOOKS_VAR] = value.describe()
            elif value != f.default and value is not None:
                out[f.metadata["var"]] = as_text(value)
        return out

    def settings(self) -> list[tuple[str, str, str]]:
        """(variable, value, where it came from) for every parameter (``polycast
        config``)."""
        sources = dict(self.sources)
        out = []
        for f in PARAMS:
            var, value = f.metadata["var"], getattr(self, f.name)
            if f.name == "algorithms":
                for c in Collective:
                    v = self.algorithm(c)
                    name = algorithm_var(c)
                    out.append((name, v or "auto", sources.get(name, "default")))
                continue
            show = f.metadata.get("show")
            text = show(value) if show else ("" if value is None else as_text(value))
            out.append((var, text or "(unset)", sources.get(var, "default")))
        return out


def algorithm_var(coll: Collective) -> str:
    return f"{PREFIX}{coll.name}_ALGO"


ALGO_VARS = {algorithm_var(c): c for c in Collective}

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


# The parameters' fields (every one with a variable), and the one each variable sets.
PARAMS = [f for f in dataclasses.fields(Config) if f.metadata.get("var")]
BY_VAR = {f.metadata["var"]: f for f in PARAMS if f.name != "algorithms"}
_VAR_OF = {f.name: f.metadata["var"] for f in PARAMS}
_FIELD = {f.name: f for f in PARAMS}


def known_variables() -> list[str]:
    return sorted(set(BY_VAR) | set(ALGO_VARS) | set(JOB_VARIABLES))

