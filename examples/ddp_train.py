"""Train a small transformer with DistributedDataParallel on CPU; the backend is one word.

    torchrun --nproc-per-node 4 examples/ddp_train.py --backend polycast
    torchrun --nproc-per-node 4 examples/ddp_train.py --backend gloo
    polycast run -n 4 examples/ddp_train.py

Prints the loss of every step (the mean over ranks) on rank 0; ``--json`` adds one JSON
line with the losses and step times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_transformer import TinyTransformer, batch  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="polycast", choices=("polycast", "gloo"))
    p.add_argument("--allreduce-algo", default=None,
                   help="polycast allreduce algorithm (ring, dbtree, auto...; default: "
                        "POLYCAST_ALLREDUCE_ALGO, else auto)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--bucket-mb", type=float, default=4.0, help="DDP bucket size (MiB)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    options = None
    if args.backend == "polycast":
        import polycast.torch
        options = polycast.torch.Options(allreduce=args.allreduce_algo)
    elif args.allreduce_algo:
        sys.exit("--allreduce-algo only applies to --backend polycast")
    dist.init_process_group(args.backend, pg_options=options)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(TinyTransformer(args.vocab, args.width, args.layers, seq=args.seq),
                bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, times = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = batch(step, rank, args.batch, args.seq, args.vocab)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = mean.item() / size
        losses.append(mean)
        if rank == 0:
            print(f"step {step} loss {mean:.6f} ({times[-1] * 1e3:.0f} ms)", flush=True)
    if rank == 0 and args.json:
        print(json.dumps({"backend": args.backend, "ranks": size, "losses": losses,
                          "allreduce_algo": args.allreduce_algo, "step_seconds": times}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
