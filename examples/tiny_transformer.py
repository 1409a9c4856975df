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
