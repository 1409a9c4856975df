"""A rank whose torch store is not there (tests/test_torch_faults.py): init_process_group
must fail within POLYCAST_TIMEOUT naming the store's address."""

from __future__ import annotations

import os
import time

import torch.distributed as dist

import polycast.torch  # noqa: F401  (registers the backend, bounds the store's wait)
from torch_report import report

t0 = time.monotonic()
try:
    dist.init_process_group("polycast")
    out = {"error": None}
except Exception as exc:
    out = {"error": str(exc), "error_type": type(exc).__name__}
out.update(rank=int(os.environ["RANK"]), seconds=time.monotonic() - t0)
report(out, out["rank"])
