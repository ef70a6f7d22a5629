"""`ModelSpec`: one zoo entry, able to build its model, example inputs and loss on any device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn

from tag.errors import ModelError

__all__ = ["ModelSpec", "ModelVariant", "LossFn", "InputFactory", "Built"]

LossFn = Callable[[Any], Tensor]
"""Maps the model's output to a scalar loss; targets are made inside with factory ops."""

InputFactory = Callable[[int, torch.device, "torch.Generator | None"], tuple[Tensor, ...]]
"""(batch_size, device, generator) -> example inputs, dim 0 of each is the batch.

The generator is None on the meta device, where inputs carry shapes only."""

Built = tuple[nn.Module, tuple[Tensor, ...], LossFn]

EXAMPLE_INPUT_SEED = 0  # example inputs on real devices are drawn from this seed, so builds repeat


@dataclass(frozen=True)
class ModelVariant:
    """One size of an architecture: how to make its module, its inputs and its loss."""

    make_model: Callable[[], nn.Module]  # called under `with torch.device(device)`
    make_inputs: InputFactory
    loss_fn: LossFn
    batch_size: int  # default batch of this variant
    config: Any  # the architecture's config dataclass, shown in docs
    input_size: str  # human summary of one sample, e.g. "3x224x224" or "seq 512"


@dataclass(frozen=True)
class ModelSpec:
    """A zoo model: the paper's settings plus a full-size and a tiny variant of the same code."""

    name: str  # e.g. "resnet101"
    description: str  # one line
    batch_size: int  # the paper's (mini- or micro-) batch size
    paper_parameters: float | None  # parameter count the paper or the standard model reports
    paper_source: str  # where batch size and parameter count come from
    full: ModelVariant = field(repr=False, compare=False)
    tiny: ModelVariant = field(repr=False, compare=False)

    def build(self, *, tiny: bool = False, batch_size: int | None = None,
              device: str | torch.device = "meta") -> Built:
        """Build ``(model, example_inputs, loss_fn)`` with ``loss_fn(model(*example_inputs))`` a scalar.

        On ``meta`` nothing is allocated (parameters and inputs carry shapes only); on a real device the
        parameters use PyTorch's default init under the global seed and the inputs are drawn from
        :data:`EXAMPLE_INPUT_SEED`. ``batch_size`` defaults to the paper's, or 2-4 for ``tiny``.
        """
        variant = self.tiny if tiny else self.full
        batch = variant.batch_size if batch_size is None else batch_size
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ModelError(f"{self.name}: batch_size must be a positive integer, got {batch_size!r}")
        target = _parse_device(device, self.name)
        with torch.device(target):
            model = variant.make_model()
        generator = None if target.type == "meta" else torch.Generator().manual_seed(EXAMPLE_INPUT_SEED)
        inputs = variant.make_inputs(batch, target, generator)
        return model, inputs, variant.loss_fn


def _parse_device(device: str | torch.device, model_name: str) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ModelError(f"{model_name}: cannot build on device {device!r}: {error}") from None
