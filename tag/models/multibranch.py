"""GraphPipe's multi-branch models (App. A.2): a multi-modal transformer (MMT), DLRM and CANDLE-Uno.

Each takes one input tensor per branch, runs the branches independently and joins them by
concatenation, so the op graph has parallel branches that a series-parallel planner can exploit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tag.models.layers import EncoderLayer

__all__ = ["MMTConfig", "MultiModalTransformer", "DLRMConfig", "DLRM", "UnoConfig", "CandleUno"]


def _mlp(in_features: int, widths: tuple[int, ...]) -> nn.Sequential:
    """``Linear -> ReLU`` for each width. Shapes: ``[b, in_features] -> [b, widths[-1]]``."""
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class MMTConfig:
    num_branches: int = 4  # one per modality
    layers_per_branch: int = 8
    hidden: int = 1024
    num_heads: int = 16
    ffn_hidden: int = 4096
    seq_len: int = 256
    num_classes: int = 1000


class MultiModalTransformer(nn.Module):
    """Parallel pre-LN transformer encoders, one per modality, joined per token and classified.

    Each modality arrives as pre-embedded features. Shapes: ``num_branches`` inputs ``[b, seq, hidden]``
    -> concatenation ``[b, seq, num_branches * hidden]`` -> mean over seq -> logits ``[b, num_classes]``.
    """

    def __init__(self, config: MMTConfig) -> None:
        super().__init__()
        h = config.hidden
        self.branches = nn.ModuleList(
            nn.Sequential(
                *(EncoderLayer(h, config.num_heads, config.ffn_hidden, pre_norm=True)
                  for _ in range(config.layers_per_branch)),
                nn.LayerNorm(h))
            for _ in range(config.num_branches))
        self.head = nn.Linear(config.num_branches * h, config.num_classes)

    def forward(self, *modalities: Tensor) -> Tensor:
        encoded = [branch(x) for branch, x in zip(self.branches, modalities, strict=True)]  # [b, t, h] each
        joined = torch.cat(encoded, dim=-1)  # [b, t, n * h]
        return self.head(joined.mean(dim=1))


@dataclass(frozen=True)
class DLRMConfig:
    num_dense_branches: int = 7
    dense_features: int = 4096  # input width of each dense branch
    dense_widths: tuple[int, ...] = (4096, 4096, 4096, 4096)  # feed-forward layers of each dense branch
    num_sparse_branches: int = 7
    table_rows: int = 1_000_000  # entries per embedding table
    embedding_dim: int = 64
    bag_size: int = 100  # lookups per table per sample, summed
    top_widths: tuple[int, ...] = (4096, 4096, 4096)  # feed-forward layers after the interaction


class DLRM(nn.Module):
    """Deep learning recommendation model (Naumov et al. 2019) in GraphPipe's multi-branch shape.

    Interaction: DLRM's pairwise dot products of the sparse embeddings, concatenated with every branch
    output (the dense branches end at 4096 wide, so they cannot join the dot products).
    Shapes: ``num_dense_branches`` inputs ``[b, dense_features]`` then ``num_sparse_branches`` id inputs
    ``[b, bag_size]`` -> click logit ``[b, 1]``.
    """

    def __init__(self, config: DLRMConfig) -> None:
        super().__init__()
        self.num_dense = config.num_dense_branches
        self.dense_branches = nn.ModuleList(
            _mlp(config.dense_features, config.dense_widths) for _ in range(config.num_dense_branches))
        self.tables = nn.ModuleList(
            nn.Embedding(config.table_rows, config.embedding_dim) for _ in range(config.num_sparse_branches))
        n = config.num_sparse_branches
        joined = (config.num_dense_branches * config.dense_widths[-1] + n * config.embedding_dim
                  + n * (n - 1) // 2)
        self.top = _mlp(joined, config.top_widths)
        self.output = nn.Linear(config.top_widths[-1], 1)

    def _interaction(self, embedded: list[Tensor]) -> Tensor:
        """``n`` tensors ``[b, dim]`` -> their pairwise dot products ``[b, n (n - 1) / 2]``."""
        stacked = torch.stack(embedded, dim=1)  # [b, n, dim]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))  # [b, n, n]
        rows, cols = torch.triu_indices(len(embedded), len(embedded), offset=1, device=stacked.device)
        return dots[:, rows, cols]

    def forward(self, *features: Tensor) -> Tensor:
        dense_inputs, bags = features[:self.num_dense], features[self.num_dense:]  # [b, f], [b, bag]
        dense = [branch(x) for branch, x in zip(self.dense_branches, dense_inputs, strict=True)]
        sparse = [table(ids).sum(dim=1) for table, ids in zip(self.tables, bags, strict=True)]
        joined = torch.cat(dense + sparse + [self._interaction(sparse)], dim=1)  # [b, joined]
        return self.output(self.top(joined))


@dataclass(frozen=True)
class UnoConfig:
    num_branches: int = 7  # one per feature type (cell-line and drug descriptors)
    branch_features: int = 4096  # input width of each branch
    branch_widths: tuple[int, ...] = (4096, 4096, 4096, 4096)
    top_widths: tuple[int, ...] = (4096, 4096, 4096)


class CandleUno(nn.Module):
    """CANDLE-Uno drug-response regressor: parallel feature MLPs, concatenated, then a top MLP.

    Shapes: ``num_branches`` inputs ``[b, branch_features]`` -> predicted response ``[b, 1]``.
    """

    def __init__(self, config: UnoConfig) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            _mlp(config.branch_features, config.branch_widths) for _ in range(config.num_branches))
        self.top = _mlp(config.num_branches * config.branch_widths[-1], config.top_widths)
        self.output = nn.Linear(config.top_widths[-1], 1)

    def forward(self, *features: Tensor) -> Tensor:
        encoded = [branch(x) for branch, x in zip(self.branches, features, strict=True)]  # [b, w] each
        joined = torch.cat(encoded, dim=1)  # [b, n * w]
        return self.output(self.top(joined))
