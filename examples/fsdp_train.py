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
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_transformer  # noqa: E402


def shard(model, version: int):
    """FSDP2 (``fully_shard`` per block and at the root) or FSDP1 (one unit per block)."""
    if version == 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({tiny_transformer.Block}),
                device_id=torch.device("cpu"), use_orig_params=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="polycast", choices=("polycast", "gloo"))
    p.add_argument("--fsdp", type=int, default=2, choices=(1, 2),
                   help="FSDP2 (fully_shard, default) or FSDP1 (FullyShardedDataParallel)")
    p.add_argument("--allgather-algo", default=None,
                   help="polycast allgather algorithm (ring, mcast, auto...; default: "
                        "POLYCAST_ALLGATHER_ALGO, else auto)")
    p.add_argument("--reduce-scatter-algo", default=None)
    tiny_transformer.add_arguments(p)
    args = p.parse_args()
    options = None
    if args.backend == "polycast":
        import polycast.torch
        options = polycast.torch.Options(allgather=args.allgather_algo,
                                         reduce_scatter=args.reduce_scatter_algo)
    elif args.allgather_algo or args.reduce_scatter_algo:
        sys.exit("--allgather-algo / --reduce-scatter-algo only apply to --backend polycast")
    dist.init_process_group(args.backend, pg_options=options)
    model = shard(tiny_transformer.build(args), args.fsdp)
    tiny_transformer.train(model, args, backend=args.backend, trainer=f"fsdp{args.fsdp}",
                           allgather_algo=args.allgather_algo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
