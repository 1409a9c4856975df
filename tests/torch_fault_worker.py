"""One rank of the dead-rank test (tests/test_torch_faults.py): DDP on the polycast
backend; at step 2 the last rank dies between forward and backward. The others must
raise a clear error naming it within POLYCAST_TIMEOUT, not hang. Prints one JSON line."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import polycast
import polycast.torch  # noqa: F401
from torch_report import report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from tiny_transformer import TinyTransformer, batch  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("polycast")
    rank, size = dist.get_rank(), dist.get_world_size()
    victim = size - 1
    torch.manual_seed(0)
    net = DDP(TinyTransformer(128, 64, 2, seq=16), bucket_cap_mb=0.05)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    out = {"rank": rank}
    for step in range(5):
        x, y = batch(step, rank, 2, 16, 128)
        loss = net(x, y)
        if step == 2 and rank == victim:
            os._exit(17)                            # dies mid-step, before its allreduces
        t0 = time.monotonic()
        try:
            loss.backward()
            opt.step()
            dist.barrier()
        except Exception as exc:                     # what a training script would see
            out.update(error_type=type(exc).__name__, error=str(exc)[:2000],
                       polycast=isinstance(exc, polycast.PolycastError), step=step,
                       seconds=time.monotonic() - t0)
            break
    report(out, dist.get_rank())
    os._exit(0)           # the group is broken: skip destroy_process_group's goodbyes


if __name__ == "__main__":
    main()
