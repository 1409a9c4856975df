"""The calibration profile: what ``polycast tune --calibrate`` measured on this machine.

A profile is a small JSON file (``POLYCAST_PROFILE``, else
``$XDG_CACHE_HOME/polycast/profile.json``, else ``~/.cache/polycast/profile.json``)::

    {"format": 1, "polycast": "0.1.0", "machine": {...identity...}, "created": "...",
     "links": {"shm": {"latency_s", "msg_overhead_s", "port_gbps", "host_gbps"},
               "tcp": {...}},
     "multicast": {"pacing": 0.8}, "symm": {"allgather": {"4": [a_s, b_s_per_byte]}, ...},
     "modelled": {"<topology>": {"latency_scale": 1.0, ...}}, "measurements": [...]}

Loading never fails a program: a missing profile means the built-in model (silently); a
corrupt one (unreadable, not JSON, fields missing or of the wrong type), a stale one
(another machine, another format or polycast version) or one that cannot be trusted gives
one warning naming the file and the reason, and the built-in model.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import socket
import tempfile
import threading
import time
import warnings

from ..config import Config, current
from ..version import __version__

FORMAT = 1

#: The built-in model of this kind of machine (a Python engine over shared memory or TCP),
#: used without a profile. Orders of magnitude from bench/engine.py and bench/peers.py on a
#: 2-core host; calibration replaces them.
BUILTIN_LINKS = {
    "shm": {"latency_s": 40e-6, "msg_overhead_s": 15e-6, "port_gbps": 16.0,
            "host_gbps": 40.0},
    "tcp": {"latency_s": 80e-6, "msg_overhead_s": 20e-6, "port_gbps": 8.0,
            "host_gbps": 40.0},
}
#: A multicast stream's share of the port: receivers handle every datagram in Python.
BUILTIN_MULTICAST = {"pacing": 0.25}
#: Symmetric memory, per collective: (seconds, seconds per byte of S) at 4 ranks. The fixed
#: part is one barrier round (runtime/symm/staged.py: calls up to 1 MiB a rank take one);
#: bench/peers.py measured the engine slower than this path at every size on one host
#: (e.g. 8 B broadcast, 4 ranks: engine 367 us, symm 95 us), below the engine's model.
BUILTIN_SYMM = {
    "allgather": {"4": [30e-6, 1.0 / 2.0e9]},
    "reduce_scatter": {"4": [30e-6, 1.0 / 1.5e9]},
    "allreduce": {"4": [30e-6, 1.0 / 1.2e9]},
    "broadcast": {"4": [30e-6, 1.0 / 2.0e9]},
}


def default_path(cfg: Config | None = None) -> str:
    """``cfg``'s POLYCAST_PROFILE (default: the current configuration's), else the
    user's cache directory."""
    path = (cfg or current()).profile_path
    if path:
        return path
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "polycast", "profile.json")


def machine_identity() -> dict:
    """What makes measurements of this machine valid: host name, CPU count and model,
    platform, and the machine id when the OS has one."""
    ident = {"hostname": socket.gethostname(), "cpus": os.cpu_count() or 1,
             "platform": platform.platform(terse=True), "processor": _cpu_model()}
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as fh:
                mid = fh.read().strip()
            if mid:
                ident["machine_id"] = hashlib.sha256(mid.encode()).hexdigest()[:16]
                break
        except OSError:
            continue
    return ident


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class ProfileError(ValueError):
    """Why a profile cannot be used (the message goes into the warning)."""


def validate(data) -> dict:
    """Check a profile's structure and values; returns it, or raises ProfileError."""
    if not isinstance(data, dict):
        raise ProfileError("not a JSON object")
    if data.get("format") != FORMAT:
        raise ProfileError(f"format {data.get('format')!r}, this polycast reads {FORMAT}")
    links = data.get("links")
    if not isinstance(links, dict) or not links:
        raise ProfileError("no 'links' section")
    for name, lk in links.items():
        if name not in BUILTIN_LINKS:
            raise ProfileError(f"unknown link class {name!r}")
        if not isinstance(lk, dict):
            raise ProfileError(f"links.{name} is not an object")
        for key in BUILTIN_LINKS[name]:
            v = lk.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                    or v < 0 or (key.endswith("gbps") and v <= 0):
                raise ProfileError(f"links.{name}.{key} = {v!r} is not a valid number")
    symm = data.get("symm", {})
    if not isinstance(symm, dict):
        raise ProfileError("'symm' is not an object")
    for coll, table in symm.items():
        if not isinstance(table, dict):
            raise ProfileError(f"symm.{coll} is not an object")
        for p, ab in table.items():
            if (not str(p).isdigit() or not isinstance(ab, list) or len(ab) != 2
                    or not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0
                               for x in ab)):
                raise ProfileError(f"symm.{coll}.{p} = {ab!r} is not [seconds, s/byte]")
    mc = data.get("multicast", {})
    if not isinstance(mc, dict):
        raise ProfileError("'multicast' is not an object")
    pacing = mc.get("pacing", 1.0)
    if not isinstance(pacing, (int, float)) or not 0 < pacing <= 1:
        raise ProfileError(f"multicast.pacing = {pacing!r} is not in (0, 1]")
    modelled = data.get("modelled", {})
    if not isinstance(modelled, dict):
        raise ProfileError("'modelled' is not an object")
    for name, entry in modelled.items():
        for key in ("latency_scale", "bandwidth_scale"):
            v = entry.get(key) if isinstance(entry, dict) else None
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ProfileError(f"modelled[{name!r}].{key} = {v!r} is not a positive number")
    return data


def stale_reason(data: dict) -> str | None:
    """Why a valid profile does not describe this machine and this polycast, or None."""
    if data.get("polycast") != __version__:
        return f"made by polycast {data.get('polycast')!r}, this is {__version__}"
    mine, theirs = machine_identity(), data.get("machine")
    if not isinstance(theirs, dict):
        return "no machine identity"
    for key in ("machine_id", "hostname", "cpus", "processor"):
        if key in mine and theirs.get(key) != mine[key]:
            return f"measured on another machine ({key} {theirs.get(key)!r}, here {mine[key]!r})"
    return None


_LOCK = threading.Lock()
_LOADED: dict[str, tuple[float, dict | None]] = {}
_WARNED: set = set()


def load(path: str | None = None, *, warn: bool = True) -> dict | None:
    """The profile at ``path`` (default :func:`default_path`) if it is usable, else None
    (with one warning per file and reason when it exists but cannot be used). Cached per
    file and modification time."""
    path = path or default_path()
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return None                      # missing: the built-in model, silently
    with _LOCK:
        hit = _LOADED.get(path)
        if hit is not None and hit[0] == mtime:
            return hit[1]
    try:
        with open(path) as fh:
            data = validate(json.load(fh))
        why = stale_reason(data)
        if why:
            raise ProfileError(f"stale: {why}")
    except (OSError, ValueError) as exc:       # JSONDecodeError and ProfileError included
        reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ProfileError) \
            else str(exc)
        key = (path, reason)
        if warn and key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"polycast: calibration profile {path} not used ({reason}); "
                          "using the built-in model (re-run `polycast tune --calibrate`)",
                          RuntimeWarning, stacklevel=2)
        data = None
    with _LOCK:
        _LOADED[path] = (mtime, data)
    return data


def save(data: dict, path: str | None = None) -> str:
    """Write a profile atomically (ranks loading it meanwhile see the old or the new one,
    never half of one); fills in format, version, identity and date."""
    path = path or default_path()
    data = dict(data)
    data.update(format=FORMAT, polycast=__version__, machine=machine_identity(),
                created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    validate(data)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".profile-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    with _LOCK:
        _LOADED.pop(path, None)
    return path
