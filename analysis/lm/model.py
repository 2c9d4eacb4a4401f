"""A small decoder-only transformer whose head is the op this repository studies.

Token and learned position embeddings, pre-norm blocks (causal self-attention, then a GELU MLP,
each added to the residual stream), a final LayerNorm, and a linear head *without bias* and
*untied* from the embedding: ``logits = hidden @ head.weight.T`` with ``head.weight`` of shape
``(vocab_size, d_model)``. :meth:`TinyLM.hidden` returns the final-normed states the head reads, so
the training loss can be computed by any ``(hidden, weight, targets) -> loss`` function.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ModelConfig", "TinyLM"]


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of :class:`TinyLM`; ``d_model`` must be a multiple of ``n_heads``."""

    vocab_size: int
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    context: int = 128
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "context", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig.d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        # (B, T, 3D) -> three (B, heads, T, D/heads) tensors
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, width // self.n_heads).permute(2, 0, 3, 1, 4)
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(mixed.transpose(1, 2).reshape(batch, length, width))


class _Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = _SelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        hidden = config.mlp_ratio * config.d_model
        self.mlp = nn.Sequential(nn.Linear(config.d_model, hidden), nn.GELU(), nn.Linear(hidden, config.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    """The language model; ``head.weight`` (``(vocab_size, d_model)``) is the studied ``W``.

    Initialised from torch's global RNG: seed it first (``torch.manual_seed``) for a reproducible model.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._initialise()

    def _initialise(self) -> None:
        # Small normal weights everywhere; the two projections that write into the residual stream
        # are shrunk by sqrt(2 * layers) so the stream's variance does not grow with depth.
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, parameter in self.named_parameters():
            if parameter.dim() < 2:
                continue  # LayerNorm gains stay 1, biases 0
            std = residual_std if name.endswith(("attention.out.weight", "mlp.2.weight")) else 0.02
            nn.init.normal_(parameter, mean=0.0, std=std)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final-normed states the head reads: ``(B, T)`` int64 tokens -> ``(B, T, d_model)``."""
        length = tokens.shape[-1]
        if length > self.config.context:
            raise ValueError(f"sequence length {length} exceeds the model's context {self.config.context}")
        positions = torch.arange(length, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab_size)``: the head applied to :meth:`hidden`."""
        return self.head(self.hidden(tokens))
