"""Train a small transformer with DistributedDataParallel on CPU; the backend is one word.

    torchrun --nproc-per-node 4 examples/ddp_train.py --backend polycast
    torchrun --nproc-per-node 4 examples/ddp_train.py --backend gloo
    polycast run -n 4 examples/ddp_train.py

Prints the loss of every step (the mean over ranks) on rank 0; ``--json`` adds one JSON
line with the losses and step times.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_transformer  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="polycast", choices=("polycast", "gloo"))
    p.add_argument("--allreduce-algo", default=None,
                   help="polycast allreduce algorithm (ring, dbtree, auto...; default: "
                        "POLYCAST_ALLREDUCE_ALGO, else auto)")
    p.add_argument("--bucket-mb", type=float, default=4.0, help="DDP bucket size (MiB)")
    tiny_transformer.add_arguments(p)
    args = p.parse_args()
    options = None
    if args.backend == "polycast":
        import polycast.torch
        options = polycast.torch.Options(allreduce=args.allreduce_algo)
    elif args.allreduce_algo:
        sys.exit("--allreduce-algo only applies to --backend polycast")
    dist.init_process_group(args.backend, pg_options=options)
    model = DDP(tiny_transformer.build(args), bucket_cap_mb=args.bucket_mb)
    tiny_transformer.train(model, args, backend=args.backend, trainer="ddp",
                           allreduce_algo=args.allreduce_algo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
