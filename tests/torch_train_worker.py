"""One rank of the training comparison (tests/test_torch_training.py runs it under
torchrun): DDP, FSDP1 and FSDP2 train the example transformer for 5 steps on gloo and on
polycast groups (allgather on ring and on mcast; the default ``auto``), in the same
processes, from the same initial weights and batches. Prints one JSON line with every
run's losses, for the test to compare with gloo's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import polycast.torch as pt
from torch_report import report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from tiny_transformer import Block, TinyTransformer, batch  # noqa: E402

STEPS = 5
VOCAB, WIDTH, LAYERS, SEQ, BATCH = 128, 64, 2, 16, 2


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TinyTransformer(VOCAB, WIDTH, LAYERS, heads=4, seq=SEQ)


def train(wrap, group) -> list[float]:
    net = wrap(model(), group)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    rank, size = dist.get_rank(), dist.get_world_size()
    losses = []
    for step in range(STEPS):
        x, y = batch(step, rank, BATCH, SEQ, VOCAB)
        loss = net(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)               # on the default (gloo) group: the same for all
        losses.append(mean.item() / size)
    return losses


def ddp(m, group):
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(m, process_group=group, bucket_cap_mb=0.05)     # several buckets


def fsdp1(m, group):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FSDP(m, process_group=group, auto_wrap_policy=ModuleWrapPolicy({Block}),
                device_id=torch.device("cpu"), use_orig_params=True)


def fsdp2(m, group):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in m.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(m, mesh=mesh)


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    gloo = dist.group.WORLD
    groups = {"auto": dist.new_group(backend="polycast"),
              "ring": dist.new_group(backend="polycast", pg_options=pt.Options(
                  allgather="ring", reduce_scatter="ring", allreduce="ring")),
              "mcast": dist.new_group(backend="polycast", pg_options=pt.Options(
                  allgather="mcast"))}
    plan = {"ddp": (ddp, ["auto", "ring"]), "fsdp1": (fsdp1, ["ring", "mcast"]),
            "fsdp2": (fsdp2, ["auto", "ring", "mcast"])}
    out = {"rank": dist.get_rank(),
           "mcast_error": groups["mcast"].comm.mcast_error, "runs": {}}
    for name, (wrap, which) in plan.items():
        out["runs"][f"{name}/gloo"] = train(wrap, gloo)
        for g in which:
            out["runs"][f"{name}/{g}"] = train(wrap, groups[g])
    # The mcast group's all-gathers went out as multicast datagrams (not a fallback).
    out["mcast_datagrams_out"] = groups["mcast"].comm.stats().datagram_bytes_out
    out["ring_datagrams_out"] = groups["ring"].comm.stats().datagram_bytes_out
    report(out, dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
