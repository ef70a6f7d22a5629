"""The executable train step of one model: argument records at every batch size a plan needs.

A plan is made for the OpGraph of one training step at the global batch B. Running it needs more than
that graph: a replica of a batch-split group computes its ops on its own rows, so the executor needs the
same ops recorded at that batch size (view shapes, expand sizes and reduction counts are fixed at trace
time). :class:`Program` traces the model once per batch size it is asked for, with each call's output
shapes recorded (``trace(..., output_specs=True)``), and checks that every trace has the planned graph's
ops and edges in the same order, so that op ``i`` means the same call at every batch size.

It also holds the real initial tensors (parameters as the model has them, zero optimizer states, the
example inputs at the global batch) and names the ops whose result a batch split changes
(:func:`batch_coupled_ops`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

from tag.errors import ModelError
from tag.graph.opgraph import ROLE_FORWARD, SPLIT_SUM, OpGraph
from tag.graph.tracer import trace

__all__ = ["Program", "build_program", "zoo_program", "user_program", "resolve_program", "batch_coupled_ops",
           "batch_statistics", "RNG_KINDS", "BATCH_STATISTICS_KINDS", "SHAPE_ONLY_KINDS"]

# Ops that draw random numbers: a batch split (or another rank) draws different ones.
RNG_KINDS = ("aten.bernoulli", "aten.native_dropout", "aten.rand", "aten.randn", "aten.randint", "aten.randperm",
             "aten.normal", "aten.uniform", "aten.multinomial", "aten.exponential", "aten.poisson")
# Train-mode batch norm: statistics over the rows a replica holds, not over the batch.
BATCH_STATISTICS_KINDS = ("aten._native_batch_norm_legit_functional", "aten._native_batch_norm_legit.default",
                          "aten.native_batch_norm.default", "aten._batch_norm_with_update",
                          "aten.cudnn_batch_norm", "aten.miopen_batch_norm")


def batch_coupled_ops(graph: OpGraph) -> dict[int, str]:
    """``{op: reason}`` of the ops whose result changes when the batch is split or run elsewhere.

    Random ops (dropout's mask), train-mode batch norm (batch statistics), and tensor constants the trace
    captured with the batch in dim 0 (a loss target from a closure: it cannot follow a replica's rows).
    """
    coupled: dict[int, str] = {}
    batch = graph.batch_size
    for i, kind in enumerate(graph.kinds):
        record = graph.args[i] if graph.args else {}
        if kind.startswith(RNG_KINDS):
            coupled[i] = "random numbers"
        elif kind.startswith(BATCH_STATISTICS_KINDS) and _training_flag(record):
            coupled[i] = "batch statistics"
        elif record.get("target") == "get_attr" and record.get("shape", [])[:1] == [batch] and batch > 1 \
                and (graph.batch_scaled[i] or _meets_the_batch(graph, i)):
            coupled[i] = "a batch-sized tensor constant (return it as a loss target or make it a model input)"
    return coupled


def _meets_the_batch(graph: OpGraph, op: int) -> bool:
    """Whether a reader of ``op`` also reads a tensor that scales with the batch (a label captured by the
    loss's closure, read beside the logits)."""
    return any(graph.batch_scaled[p] for c in graph.successors(op).tolist()
               for p in graph.predecessors(c).tolist() if p != op)


# Ops that read only the shape, dtype and device of their tensor argument.
SHAPE_ONLY_KINDS = ("aten.ones_like.", "aten.zeros_like.", "aten.empty_like.", "aten.full_like.", "aten.new_ones.",
                    "aten.new_zeros.", "aten.new_empty.", "aten.new_full.")


def batch_statistics(graph: OpGraph) -> list[int]:
    """Forward values that sum over the whole batch and that an op other than a sum reads: a loss's
    normaliser (cross-entropy's count of counted targets), a batch mean. A step cut into micro-batches that
    each normalise by their own rows (torch's pipeline schedules) computes them per micro-batch instead."""
    found = []
    for p in np.flatnonzero((graph.role == ROLE_FORWARD) & (graph.split == SPLIT_SUM)).tolist():
        if any(graph.split[c] != SPLIT_SUM and not graph.kinds[c].startswith(SHAPE_ONLY_KINDS)
               for c in graph.successors(p).tolist()):
            found.append(p)
    return found


def _training_flag(record: dict) -> bool:
    """Whether a batch-norm record computes batch statistics (its ``training`` argument)."""
    args = record.get("args", [])
    if record.get("target", "").startswith("aten._native_batch_norm_legit_functional"):
        return bool(args[5]) if len(args) > 5 else True
    if record.get("target", "").startswith("aten._native_batch_norm_legit.no_stats"):
        return True
    flags = [a for a in args[3:8] if isinstance(a, bool)]
    return flags[0] if flags else True


@dataclass
class Program:
    """One model's train step, executable at any batch size that divides into whole rows.

    ``graph``: the OpGraph at the global batch B (with output specs); ``records[b]``: the argument
    records of the same ops traced at batch b; ``tensors``: placeholder name → initial value at batch B.
    """

    name: str
    graph: OpGraph
    tensors: dict[str, torch.Tensor]
    coupled: dict[int, str]
    _retrace: Callable[[int], OpGraph] = field(repr=False)
    records: dict[int, list[dict]] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.graph.batch_size)

    def at(self, batch: int) -> list[dict]:
        """The argument records at ``batch`` rows (traced on first use)."""
        if batch not in self.records:
            if not 1 <= batch <= self.batch_size:
                raise ModelError(f"{self.name}: cannot run {batch} rows of a batch of {self.batch_size}")
            other = self._retrace(batch)
            _check_same_ops(self.graph, other, self.name)
            self.records[batch] = other.args
        return self.records[batch]

    def batch_dim(self, op: int, out: int) -> tuple[int, int] | None:
        """(dim, rows per sample) of output ``out`` of ``op``: where its batch rows lie; None when its shape
        does not scale with the batch (a scalar that a folded view broadcasts over the batch)."""
        full = _spec(self.graph.args[op], out)
        if len(self.records) == 1 and self.batch_size > 1:
            self.at(max(1, self.batch_size // 2))  # a second trace shows where the batch lies
        batch = next((b for b in sorted(self.records) if b != self.batch_size), None)
        if batch is None:
            return None
        part = _spec(self.records[batch][op], out)
        for d, (a, b) in enumerate(zip(full[0], part[0])):
            if a != b:
                if a % self.batch_size or b * self.batch_size != a * batch:
                    raise ModelError(f"{self.name}: op {self.graph.names[op]!r} output {out} does not scale "
                                     "with the batch in whole rows")
                return d, a // self.batch_size
        return None

    def spec(self, op: int, out: int, batch: int) -> tuple[list[int], str]:
        return _spec(self.at(batch)[op], out)


def _spec(record: dict, out: int) -> tuple[list[int], str]:
    if record.get("target") in ("placeholder", "get_attr"):
        return list(record["shape"]), record["dtype"]
    specs = record.get("outputs")
    if specs is None or out >= len(specs) or specs[out] is None:
        raise ModelError(f"no output spec for output {out} of {record.get('target')}")
    return list(specs[out][0]), specs[out][1]


def _check_same_ops(graph: OpGraph, other: OpGraph, name: str) -> None:
    if other.kinds != graph.kinds or not np.array_equal(other.edge_src, graph.edge_src) \
            or not np.array_equal(other.edge_dst, graph.edge_dst):
        raise ModelError(f"{name}: traced at batch {other.batch_size} the train step has other ops than at batch "
                         f"{graph.batch_size}; it cannot be split into replicas of these sizes")


def _slice_inputs(inputs: tuple, batch: int, rows: int) -> tuple:
    return tuple(x[:rows] if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch else x
                 for x in inputs)


def build_program(model: nn.Module, example_inputs: tuple, loss_fn: Callable, *, name: str,
                  optimizer: str = "adam", targets: tuple = ()) -> Program:
    """Trace ``model`` (on the CPU, with real parameters and inputs) into a :class:`Program`; ``targets``:
    the loss's label tensors, inputs of the step after the model's (``loss_fn(output, *targets)``)."""
    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    targets = tuple(targets) if isinstance(targets, (tuple, list)) else (targets,)
    graph = trace(model, example_inputs, loss_fn, name=name, optimizer=optimizer, output_specs=True, targets=targets)
    batch = graph.batch_size

    def retrace(rows: int) -> OpGraph:
        return trace(model, _slice_inputs(example_inputs, batch, rows), loss_fn, name=name, optimizer=optimizer,
                     output_specs=True, targets=_slice_inputs(targets, batch, rows))

    return Program(name, graph, _initial_tensors(model, example_inputs + targets, graph), batch_coupled_ops(graph),
                   retrace, {batch: graph.args})


def _initial_tensors(model: nn.Module, example_inputs: tuple, graph: OpGraph) -> dict[str, torch.Tensor]:
    """Placeholder name → real value: parameters, buffers, zero Adam states, the inputs."""
    tensors: dict[str, torch.Tensor] = {}
    for key, p in model.named_parameters():
        value = p.detach().clone()
        tensors[f"parameter:{key}" if p.requires_grad else f"buffer:{key}"] = value
        tensors[f"exp_avg:{key}"] = torch.zeros_like(value)
        tensors[f"exp_avg_sq:{key}"] = torch.zeros_like(value)
    for key, b in model.named_buffers():
        tensors[f"buffer:{key}"] = b.detach().clone()
    slots = [k for k, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
    for slot in slots:
        tensors[f"input:{slot}"] = example_inputs[slot].detach().clone()
    names = {record.get("name") for record in graph.args if record.get("target") == "placeholder"}
    missing = sorted(names - set(tensors))
    if missing:
        raise ModelError(f"{graph.meta.get('model')}: no value for the step's input {missing[0]!r}")
    if any(t.device.type == "meta" for t in tensors.values()):
        raise ModelError("the model is on the meta device: build it on the CPU to run it")
    return {k: v for k, v in tensors.items() if k in names}


def zoo_program(name: str, *, tiny: bool = False, batch_size: int | None = None, seed: int = 0) -> Program:
    """The :class:`Program` of a zoo model built on the CPU with parameters drawn under ``seed``."""
    from tag.models import get_model

    spec = get_model(name)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model, inputs, loss_fn = spec.build(tiny=tiny, batch_size=batch_size, device="cpu")
    return build_program(model, inputs, loss_fn, name=f"{spec.name}-tiny" if tiny else spec.name)


def user_program(spec: str) -> Program:
    """The :class:`Program` of ``MODULE:FUNCTION`` (the function returns model, example inputs, loss and
    optionally the loss targets)."""
    from tag.graph.user_code import load_user_step

    model, inputs, loss_fn, targets = load_user_step(spec)
    return build_program(model, inputs, loss_fn, name=spec.rsplit(":", 1)[-1], targets=targets)


def resolve_program(text: str, *, tiny: bool = False, batch_size: int | None = None, seed: int = 0) -> Program:
    """A zoo name or MODULE:FUNCTION → its :class:`Program`; graph files and profiles cannot run."""
    from tag.models import MODELS

    key = text.strip().lower().replace("_", "-") if isinstance(text, str) else ""
    if key in MODELS:
        return zoo_program(key, tiny=tiny, batch_size=batch_size, seed=seed)
    if isinstance(text, str) and ":" in text and not text.lower().endswith((".json", ".json.gz", ".txt")):
        if batch_size is not None:
            raise ModelError("--batch-size applies to zoo models; MODULE:FUNCTION sets its own example batch")
        return user_program(text)
    raise ModelError(f"{text!r} cannot run: `tag run` needs a zoo model or MODULE:FUNCTION (a graph file or a "
                     "PipeDream profile has no PyTorch code to execute)")
