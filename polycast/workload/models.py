"""Transformer presets from the published configurations, and their parameters and FLOPs.

Each preset is a decoder-only transformer: ``layers`` blocks of attention (grouped-query
when ``kv_heads`` < ``heads``) and a SwiGLU MLP (GPT-3: a 4h GELU MLP), two norms per
block, token embeddings and an untied output head. Sources: the model cards and
``config.json`` of Llama 2 (7B, 13B, 70B; Touvron et al. 2023), Llama 3 (8B, 70B) and
Llama 3.1 405B (Dubey et al. 2024), GPT-3 175B (Brown et al. 2020).

FLOPs (matmuls; a multiply-add is 2 FLOPs): a block's forward is 2 x params x tokens, plus
attention's two s x s products, 4 x seq x hidden per token, when a sequence length is
given (the full product, as Megatron-LM's accounting counts it; causal kernels skip about
half). Backward is twice forward. The output head's forward is 2 x hidden x vocab x tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnknownName


@dataclass(frozen=True)
class Transformer:
    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    gated_mlp: bool = True          # SwiGLU (3 matrices); False: GELU (2 matrices, biases)

    @property
    def block_params(self) -> int:
        """Parameters of one transformer block."""
        h = self.hidden
        kv = h * self.kv_heads // self.heads
        if self.gated_mlp:
            return 2 * h * h + 2 * h * kv + 3 * h * self.ffn + 2 * h
        # GPT-3: q,k,v,o with biases, 2-matrix MLP with biases, two LayerNorms (scale+bias)
        return 4 * h * h + 4 * h + 2 * h * self.ffn + self.ffn + h + 4 * h

    @property
    def root_params(self) -> int:
        """Token embeddings, the final norm and the untied output head (FSDP's root unit)."""
        return 2 * self.vocab * self.hidden + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.root_params

    def block_flops(self, tokens: int, seq: int | None = None) -> float:
        """Forward FLOPs of one block for ``tokens`` tokens (attention when ``seq``)."""
        f = 2.0 * self.block_params * tokens
        if seq:
            f += 4.0 * seq * self.hidden * tokens
        return f

    def head_flops(self, tokens: int) -> float:
        return 2.0 * self.hidden * self.vocab * tokens

    def describe(self) -> str:
        gqa = f", GQA {self.kv_heads} kv heads" if self.kv_heads != self.heads else ""
        return (f"h={self.hidden}, ffn={self.ffn}, {self.layers} layers, {self.heads} heads"
                f"{gqa}, vocab {self.vocab}: {self.params / 1e9:.2f} B parameters")


MODELS: dict[str, Transformer] = {m.name: m for m in (
    Transformer("llama2-7b", 32, 4096, 11008, 32, 32, 32000),
    Transformer("llama2-13b", 40, 5120, 13824, 40, 40, 32000),
    Transformer("llama2-70b", 80, 8192, 28672, 64, 8, 32000),
    Transformer("llama3-8b", 32, 4096, 14336, 32, 8, 128256),
    Transformer("llama3-70b", 80, 8192, 28672, 64, 8, 128256),
    Transformer("llama3-405b", 126, 16384, 53248, 128, 8, 128256),
    Transformer("gpt3-175b", 96, 12288, 4 * 12288, 96, 96, 50257, gated_mlp=False),
)}


def get_model(name: str) -> Transformer:
    m = MODELS.get(str(name).lower())
    if m is None:
        raise UnknownName("model", name, list(MODELS))
    return m
