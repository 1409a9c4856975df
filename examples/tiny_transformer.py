"""The small decoder-only transformer examples/fsdp_train.py and ddp_train.py train.

About 3.7 M parameters at the defaults (4 layers, width 256, vocabulary 1024): big enough
that FSDP's all-gathers and reduce-scatters are real messages (about 0.8 M parameters per
layer), small enough to train for a few steps on CPU. The data are sequences that follow
a fixed rule from a random start (so the loss falls within a few steps), drawn from a
seed per step and rank: every run of a script sees the same batches.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 1024, width: int = 256, layers: int = 4,
                 heads: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.layers = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1),
                             persistent=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of predicting ``targets`` (a scalar: FSDP2 warns about
        a root module returning a view, which logits from a 3-D Linear are)."""
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:n]
        for layer in self.layers:
            x = layer(x, self.mask[:n, :n])
        logits = self.head(self.norm(x))
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1))


def batch(step: int, rank: int, batch_size: int, seq: int, vocab: int):
    """This rank's (inputs, targets) for a step: the same on every run."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    start = torch.randint(0, vocab, (batch_size, 1), generator=g)
    steps = torch.arange(seq + 1).unsqueeze(0)
    tokens = (start + 7 * steps) % vocab
    return tokens[:, :-1], tokens[:, 1:]


# -- what both training scripts share -------------------------------------------------------
def add_arguments(p) -> None:
    """The model, data and loop options of examples/fsdp_train.py and ddp_train.py."""
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--json", action="store_true", help="also print the losses as JSON")


def build(args) -> TinyTransformer:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)                    # the same initial weights on every rank
    return TinyTransformer(args.vocab, args.width, args.layers, seq=args.seq)


def train(model: nn.Module, args, **describe) -> list[float]:
    """Train for ``args.steps`` steps; rank 0 prints each step's loss (the mean over
    ranks) and, with ``--json``, one JSON line with ``describe``, losses and step times."""
    import json
    import time

    import torch.distributed as dist
    rank, size = dist.get_rank(), dist.get_world_size()
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
        losses.append(mean.item() / size)
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.6f} ({times[-1] * 1e3:.0f} ms)", flush=True)
    if rank == 0 and args.json:
        print(json.dumps({**describe, "ranks": size, "losses": losses,
                          "step_seconds": times}), flush=True)
    return losses
