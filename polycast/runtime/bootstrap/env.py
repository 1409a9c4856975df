"""Where this process sits in the job: rank, size, local rank and the rendezvous address.

Detected from the environment of whichever launcher started us, in this order:

=============== =========================================== ===============================
launcher        rank / size / local rank                    rendezvous address
=============== =========================================== ===============================
polycast run    POLYCAST_RANK, POLYCAST_SIZE,               POLYCAST_MASTER_ADDR,
                POLYCAST_LOCAL_RANK                         POLYCAST_MASTER_PORT
torchrun        RANK, WORLD_SIZE, LOCAL_RANK                MASTER_ADDR, MASTER_PORT + 1
mpiexec (Open   OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK      MASTER_ADDR/_PORT or
MPI, MPICH)     or PMI_RANK, PMI_SIZE (MPI_LOCALRANKID)     POLYCAST_MASTER_* (see below)
srun            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID   as mpiexec
=============== =========================================== ===============================

Under torchrun the agent's own TCPStore listens on MASTER_PORT; polycast runs its own
store on MASTER_PORT + 1 rather than depending on torch (the core needs numpy only).
Under mpiexec and srun, when no master address is given and every rank is on this host
(local size == size), the store is on 127.0.0.1 at a port derived from the launcher's
job id; on several hosts set MASTER_ADDR and MASTER_PORT (or the POLYCAST_ ones).
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from typing import Mapping

from ...config import Config, read_var
from ...errors import InvalidArgument

DEFAULT_TIMEOUT_SECONDS = Config.timeout_seconds       # POLYCAST_TIMEOUT's default


class EnvironmentMissing(InvalidArgument):
    """The environment does not say where this process is in the job."""


@dataclass(frozen=True)
class JobEnv:
    rank: int
    size: int
    local_rank: int
    local_size: int
    master_addr: str
    master_port: int
    launcher: str                 # "polycast", "torchrun", "mpi", "slurm" or "single"
    job_id: str                   # may be "" (then rank 0 makes one up at rendezvous)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

    @property
    def single_host(self) -> bool:
        return self.local_size == self.size


NEEDED = (
    "polycast run: POLYCAST_RANK, POLYCAST_SIZE, POLYCAST_MASTER_ADDR, POLYCAST_MASTER_PORT; "
    "torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK optional); "
    "mpiexec: OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE or PMI_RANK/PMI_SIZE, plus "
    "MASTER_ADDR/MASTER_PORT unless all ranks are on one host; "
    "srun: SLURM_PROCID, SLURM_NTASKS, plus MASTER_ADDR/MASTER_PORT unless on one host")


def _int(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "")
    try:
        return int(text)
    except ValueError:
        raise EnvironmentMissing(f"environment variable {name}={text!r} is not an integer")


def timeout_from_env(env: Mapping[str, str] | None = None) -> float:
    """POLYCAST_TIMEOUT in ``env`` (default ``os.environ``), for a launcher sizing its own
    waits to its ranks' (a rank takes it from its configuration)."""
    return read_var("POLYCAST_TIMEOUT", env)


def _derived_port(job_key: str) -> int:
    """A port in [29500, 61500) both sides compute from the launcher's job id."""
    digest = hashlib.blake2b(job_key.encode(), digest_size=4).digest()
    return 29500 + int.from_bytes(digest, "big") % 32000


def _master(env: Mapping[str, str], size: int, local_size: int, job_key: str,
            launcher: str) -> tuple[str, int]:
    addr = env.get("POLYCAST_MASTER_ADDR") or env.get("MASTER_ADDR")
    port = env.get("POLYCAST_MASTER_PORT") or env.get("MASTER_PORT")
    if addr and port:
        try:
            return addr, int(port)
        except ValueError:
            raise EnvironmentMissing(f"master port {port!r} is not an integer") from None
    if local_size == size and job_key:
        return "127.0.0.1", _derived_port(launcher + ":" + job_key)
    raise EnvironmentMissing(
        f"started by {launcher} on several hosts (or without a job id) but no rendezvous "
        "address: set MASTER_ADDR and MASTER_PORT (or POLYCAST_MASTER_ADDR and "
        "POLYCAST_MASTER_PORT) to a host:port reachable from every rank")


def detect(env: Mapping[str, str] | None = None,
           timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> JobEnv:
    """Read the job's geometry from the environment (the variables its launcher set);
    raise :class:`EnvironmentMissing` naming the variables each launcher must set when
    nothing is found. ``timeout_seconds``: the job's bound on every wait (from its
    configuration)."""
    env = os.environ if env is None else env
    timeout = timeout_seconds
    if "POLYCAST_RANK" in env or "POLYCAST_SIZE" in env:
        for name in ("POLYCAST_RANK", "POLYCAST_SIZE", "POLYCAST_MASTER_ADDR",
                     "POLYCAST_MASTER_PORT"):
            if name not in env:
                raise EnvironmentMissing(f"{name} is not set (polycast run sets it); needed: "
                                         + NEEDED)
        rank, size = _int(env, "POLYCAST_RANK"), _int(env, "POLYCAST_SIZE")
        local_rank = _int(env, "POLYCAST_LOCAL_RANK") if "POLYCAST_LOCAL_RANK" in env else rank
        local_size = _int(env, "POLYCAST_LOCAL_SIZE") if "POLYCAST_LOCAL_SIZE" in env else size
        job = JobEnv(rank, size, local_rank, local_size, env["POLYCAST_MASTER_ADDR"],
                     _int(env, "POLYCAST_MASTER_PORT"), "polycast",
                     env.get("POLYCAST_JOB_ID", ""), timeout)
    elif "RANK" in env and "WORLD_SIZE" in env:
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if name not in env:
                raise EnvironmentMissing(f"RANK and WORLD_SIZE are set (torchrun) but {name} "
                                         "is not; needed: " + NEEDED)
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        local_size = (_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env
                      else (size if env["MASTER_ADDR"] in ("127.0.0.1", "localhost") else 1))
        job = JobEnv(rank, size, local_rank, local_size, env["MASTER_ADDR"],
                     _int(env, "MASTER_PORT") + 1, "torchrun",
                     env.get("TORCHELASTIC_RUN_ID", ""), timeout)
    elif "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        if "OMPI_COMM_WORLD_RANK" in env:
            rank, size = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
            local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") \
                if "OMPI_COMM_WORLD_LOCAL_RANK" in env else 0
            local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") \
                if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else 1
            job_key = env.get("OMPI_MCA_ess_base_jobid", "") or env.get("OMPI_MCA_orte_ess_jobid", "")
        else:
            if "PMI_SIZE" not in env:
                raise EnvironmentMissing("PMI_RANK is set but PMI_SIZE is not; needed: " + NEEDED)
            rank, size = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
            local_rank = _int(env, "MPI_LOCALRANKID") if "MPI_LOCALRANKID" in env else 0
            local_size = _int(env, "MPI_LOCALNRANKS") if "MPI_LOCALNRANKS" in env else 1
            job_key = env.get("PMI_KVSNAME", "") or env.get("PMI_JOBID", "")
        addr, port = _master(env, size, local_size, job_key, "mpi")
        job = JobEnv(rank, size, local_rank, local_size, addr, port, "mpi", job_key, timeout)
    elif "SLURM_PROCID" in env:
        if "SLURM_NTASKS" not in env:
            raise EnvironmentMissing("SLURM_PROCID is set but SLURM_NTASKS is not; needed: "
                                     + NEEDED)
        rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local_rank = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        nnodes = _int(env, "SLURM_NNODES") if "SLURM_NNODES" in env else 0
        local_size = size if nnodes == 1 else 1
        job_key = env.get("SLURM_JOB_ID", "") + "." + env.get("SLURM_STEP_ID", "")
        addr, port = _master(env, size, local_size, job_key.strip("."), "slurm")
        job = JobEnv(rank, size, local_rank, local_size, addr, port, "slurm", job_key, timeout)
    else:
        raise EnvironmentMissing("no launcher environment found: start the script with "
                                 "`polycast run -n N script.py`, torchrun, mpiexec or srun, "
                                 "or call polycast.init(rank=..., size=..., master_addr=..., "
                                 "master_port=...); variables needed: " + NEEDED)
    if not 0 <= job.rank < job.size:
        raise EnvironmentMissing(f"rank {job.rank} out of range for size {job.size} "
                                 f"(launcher {job.launcher})")
    if not 0 < job.master_port < 65536:
        raise EnvironmentMissing(f"master port {job.master_port} out of range 1..65535")
    return job


def host_id(override: str = "") -> str:
    """Identifies this host (and its shared-memory namespace) among the job's hosts.

    Hostname and boot id, plus the network namespace: processes in different network
    namespaces (containers, or ``ip netns`` hosts emulating a LAN) cannot reach each
    other over loopback and are different hosts to polycast (TCP, multicast with TTL 1),
    even on one kernel. POLYCAST_HOST_ID overrides all of it (e.g. to force TCP between
    ranks of one machine, or to group ranks that share /dev/shm across namespaces): the
    configuration's ``host_id``, passed as ``override``."""
    if override:
        return override
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        pass
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"
