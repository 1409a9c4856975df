"""Train a small transformer with FSDP on CPU; the backend is one word.

    torchrun --nproc-per-node 4 examples/fsdp_train.py --backend polycast
    torchrun --nproc-per-node 4 examples/fsdp_train.py --backend polycast --allgather-algo mcast
    torchrun --nproc-per-node 4 examples/fsdp_train.py --backend gloo
    polycast run -n 4 examples/fsdp_train.py --fsdp 1

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_transformer import Block, TinyTransformer, batch  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="polycast", choices=("polycast", "gloo"))
    p.add_argument("--fsdp", type=int, default=2, choices=(1, 2),
                   help="FSDP2 (fully_shard, default) or FSDP1 (FullyShardedDataParallel)")
    p.add_argument("--allgather-algo", default=None,
                   help="polycast allgather algorithm (ring, mcast, auto...; default: "
                        "POLYCAST_ALLGATHER_ALGO, else auto)")
    p.add_argument("--reduce-scatter-algo", default=None)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    options = None
    if args.backend == "polycast":
        import polycast.torch
        options = polycast.torch.Options(allgather=args.allgather_algo,
                                         reduce_scatter=args.reduce_scatter_algo)
    elif args.allgather_algo or args.reduce_scatter_algo:
        sys.exit("--allgather-algo / --reduce-scatter-algo only apply to --backend polycast")
    dist.init_process_group(args.backend, pg_options=options)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyTransformer(args.vocab, args.width, args.layers, seq=args.seq)
    if args.fsdp == 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (size,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}),
                     device_id=torch.device("cpu"), use_orig_params=True)
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
        print(json.dumps({"backend": args.backend, "fsdp": args.fsdp, "ranks": size,
                          "allgather_algo": args.allgather_algo, "losses": losses,
                          "step_seconds": times}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
