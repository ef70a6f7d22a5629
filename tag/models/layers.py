"""Transformer building blocks with explicit matmul attention, so FLOP counting sees every matmul.

There is no dropout anywhere in the zoo: it has no parameters and little cost, and leaving it out keeps
a traced train step deterministic (no RNG ops in the graph).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tag.errors import ModelError

__all__ = ["MultiHeadAttention", "FeedForward", "EncoderLayer", "DecoderLayer", "sinusoidal_positions"]


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``num_heads`` heads, with separate q, k, v, output projections.

    Shapes: ``x [b, t, d]``, ``memory [b, s, d]`` (defaults to ``x``) -> ``[b, t, d]``.
    """

    def __init__(self, d_model: int, num_heads: int, *, causal: bool = False) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ModelError(f"d_model={d_model} is not a multiple of num_heads={num_heads}")
        self.num_heads = num_heads
        self.causal = causal
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.output = nn.Linear(d_model, d_model)

    def _split_heads(self, x: Tensor) -> Tensor:
        """``[b, t, d] -> [b, heads, t, d / heads]``."""
        return x.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)

    def forward(self, x: Tensor, memory: Tensor | None = None) -> Tensor:
        memory = x if memory is None else memory
        q = self._split_heads(self.query(x))  # [b, h, t, dh]
        k = self._split_heads(self.key(memory))  # [b, h, s, dh]
        v = self._split_heads(self.value(memory))  # [b, h, s, dh]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [b, h, t, s]
        if self.causal:
            visible = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()  # [t, s]
            scores = scores.masked_fill(~visible, float("-inf"))
        context = torch.matmul(scores.softmax(dim=-1), v)  # [b, h, t, dh]
        return self.output(context.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    """Position-wise ``Linear(d, hidden) -> activation -> Linear(hidden, d)``.

    Shapes: ``[..., d] -> [..., d]``.
    """

    def __init__(self, d_model: int, hidden: int, *, activation: str = "gelu") -> None:
        super().__init__()
        if activation not in ("gelu", "gelu_tanh", "relu"):
            raise ModelError(f"unknown activation {activation!r}: expected gelu, gelu_tanh or relu")
        self.activation = activation
        self.expand = nn.Linear(d_model, hidden)
        self.contract = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        h = self.expand(x)
        if self.activation == "relu":
            h = F.relu(h)
        else:
            h = F.gelu(h, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.contract(h)


class EncoderLayer(nn.Module):
    """Self-attention + feed-forward, each in a residual; post-LN (BERT, Vaswani) or pre-LN (GPT-2).

    Shapes: ``[b, t, d] -> [b, t, d]``.
    """

    def __init__(self, d_model: int, num_heads: int, ffn_hidden: int, *, pre_norm: bool = False,
                 causal: bool = False, activation: str = "gelu", norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attention = MultiHeadAttention(d_model, num_heads, causal=causal)
        self.attention_norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.feed_forward = FeedForward(d_model, ffn_hidden, activation=activation)
        self.feed_forward_norm = nn.LayerNorm(d_model, eps=norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_norm:
            x = x + self.attention(self.attention_norm(x))
            return x + self.feed_forward(self.feed_forward_norm(x))
        x = self.attention_norm(x + self.attention(x))
        return self.feed_forward_norm(x + self.feed_forward(x))


class DecoderLayer(nn.Module):
    """Post-LN decoder layer (Vaswani et al.): causal self-attention, cross-attention, feed-forward.

    Shapes: ``x [b, t, d]``, ``memory [b, s, d]`` -> ``[b, t, d]``.
    """

    def __init__(self, d_model: int, num_heads: int, ffn_hidden: int, *, activation: str = "relu") -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, num_heads, causal=True)
        self.self_attention_norm = nn.LayerNorm(d_model)
        self.cross_attention = MultiHeadAttention(d_model, num_heads)
        self.cross_attention_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, ffn_hidden, activation=activation)
        self.feed_forward_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        x = self.self_attention_norm(x + self.self_attention(x))
        x = self.cross_attention_norm(x + self.cross_attention(x, memory))
        return self.feed_forward_norm(x + self.feed_forward(x))


def sinusoidal_positions(seq_len: int, d_model: int, *, device: torch.device) -> Tensor:
    """Fixed sine/cosine position encodings ``[seq_len, d_model]`` (Vaswani et al. §3.5).

    Computed with factory ops at call time rather than stored, so there is no buffer to move or trace.
    """
    position = torch.arange(seq_len, dtype=torch.float32, device=device).unsqueeze(1)  # [t, 1]
    frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=device)
                          * (-math.log(10000.0) / d_model))  # [d / 2]
    angles = position * frequency  # [t, d / 2]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # [t, d], sin and cos interleaved
