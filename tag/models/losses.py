"""Losses of a model's output alone: targets are made with factory ops on ``output.device``.

Making the targets inside the loss keeps the traced train step a function of the parameters and the
example inputs only; the target values (all class 0, all zeros) do not change any op's cost.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["classification_loss", "token_loss", "bert_pretraining_loss", "binary_loss", "regression_loss"]


def classification_loss(logits: Tensor) -> Tensor:
    """Cross-entropy of ``logits [batch, classes]`` against class 0."""
    targets = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)  # [batch]
    return F.cross_entropy(logits, targets)


def token_loss(logits: Tensor) -> Tensor:
    """Cross-entropy of per-token ``logits [batch, seq, vocab]`` against token 0, mean over tokens."""
    flat = logits.flatten(0, -2)  # [batch * seq, vocab]
    targets = torch.zeros(flat.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(flat, targets)


def bert_pretraining_loss(outputs: tuple[Tensor, Tensor]) -> Tensor:
    """Masked-LM loss over every position plus next-sentence loss.

    ``outputs`` = (``mlm_logits [batch, seq, vocab]``, ``nsp_logits [batch, 2]``).
    """
    mlm_logits, nsp_logits = outputs
    return token_loss(mlm_logits) + classification_loss(nsp_logits)


def binary_loss(logits: Tensor) -> Tensor:
    """Binary cross-entropy of ``logits [batch, 1]`` against label 0 (e.g. click / no click)."""
    return F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits))


def regression_loss(prediction: Tensor) -> Tensor:
    """Mean squared error of ``prediction [batch, 1]`` against 0."""
    return F.mse_loss(prediction, torch.zeros_like(prediction))
