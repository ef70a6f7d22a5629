"""PyTorch tracer: a model, example inputs and a loss → the OpGraph of one training step.

``make_fx(train_step, tracing_mode="fake")`` records the joint forward + backward + optimizer step at
aten level without allocating memory, where ``train_step`` is ``functional_call`` forward → loss →
``torch.autograd.grad`` → a functional Adam (or SGD) update. Parameters, buffers and inputs become fake
CPU tensors whatever device the model was built on, so a model on ``meta`` traces at full size.
Train-mode batch norm mutates its running statistics; the trace is re-run through
``torch.func.functionalize`` when it mutates anything, so the graph is a DAG of pure ops whose
buffer updates are outputs.

What the OpGraph holds (one op per aten call, placeholders included):

- kinds: the aten target (``"aten.addmm.default"``), ``"getitem"``, or for inputs ``"parameter"``,
  ``"buffer"``, ``"optimizer_state"``, ``"input"``, ``"constant"``;
- roles: inputs; forward = ancestors of the loss; backward = ancestors of the gradients that are not
  forward; optimizer = ancestors of the updated parameters and optimizer states that are neither; ops
  left over (buffer updates such as batch norm's running statistics) count as forward;
- FLOPs from :mod:`tag.graph.flops`; bytes_accessed = bytes of the tensor inputs and outputs (0 for
  aliases: views, getitem); output_bytes = bytes the op allocates (0 for aliases);
- split classes and batch scaling from :mod:`tag.graph._sharding` (a batch of 1 cannot be sharded:
  it is analysed on a second trace at batch 2); getitems of multi-output ops stay ops so each output
  keeps its own class (batch norm: normalised output ``concat``, statistics ``none``);
- edges: bytes of the producer's tensor(s) the consumer reads (through folded views: the smaller of the
  view and the tensor it views); ``edge_batch_scaled``: the tensor read is split along the batch;
- ``args[i]``: the JSON record of the call, ``{"target", "args", "kwargs"}``, with
  ``{"ref": op, "out": k}`` for output k of another op (0 for single-output ops) and
  ``{"expr": {"target", "args", "kwargs"}}`` for a folded view; constants as JSON, dtypes, devices,
  layouts and memory formats as ``{"dtype": "torch.float32"}`` etc., non-finite floats as
  ``{"float": "inf"}``; inputs as ``{"target": "placeholder", "name", "kind", "shape", "dtype"}`` and
  captured tensor constants as ``"get_attr"`` with their ``value`` when small; with
  ``output_specs=True`` a call's record also has ``"outputs"``: ``[shape, dtype]`` of each tensor it
  returns (``None`` for a non-tensor), what an executor needs to receive a tensor it did not compute;
- ``meta["outputs"]``: references to the loss, gradients, updated parameters, optimizer states and
  buffers; ``meta["flops_registry"]``/``["flops_fallback"]``, ``["flop_fallback_ops"]``,
  ``["split_sources"]``, ``["split_fallback_ops"]``, ``["trace_seconds"]`` say how the columns were made.
"""

from __future__ import annotations

import logging
import math
import operator
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from tag.errors import ModelError, SpecError
from tag.graph._sharding import FALLBACK_RULES as SPLIT_FALLBACK_RULES
from tag.graph._sharding import OVERRIDE_RULES as SPLIT_OVERRIDE_RULES
from tag.graph._sharding import OpResult, Ref, TensorDesc, analyse_sharding
from tag.graph.flops import FLOP_SOURCE_REGISTRY, op_flops
from tag.graph.opgraph import ROLES, SPLIT_CLASSES, OpGraph
from tag.graph.user_code import describe_failure, load_user_function

__all__ = ["trace", "trace_zoo", "load_user_function", "OPTIMIZERS", "SPLIT_OVERRIDE_RULES", "SPLIT_FALLBACK_RULES"]

log = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "sgd")
LossFn = Callable[[Any], torch.Tensor]
Progress = Callable[[str, int, int], None]
"""progress(phase, completed, total): phases are build, make_fx, functionalize, analysis, flops, graph."""

# Hyper-parameters of the traced update; their values change no op's cost.
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
LEARNING_RATE = 1e-3
ADAM_STEP = 1  # the step count is a Python constant: bias corrections become scalars

_ROLE = {name: i for i, name in enumerate(ROLES)}
_SPLIT = {name: i for i, name in enumerate(SPLIT_CLASSES)}
_ALIAS_OPS = frozenset({"aten._unsafe_view.default", "aten.lift_fresh.default"})


# ---------------------------------------------------------------------------------------- progress
class _Reporter:
    """Forwards phase progress to a callable ``fn(phase, completed, total)`` or a rich ``Progress``."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.task = None
        self.seconds: dict[str, float] = {}

    def update(self, phase: str, completed: int, total: int) -> None:
        if self.progress is None:
            return
        if hasattr(self.progress, "add_task"):
            if self.task is None:
                self.task = self.progress.add_task(phase, total=total)
            self.progress.update(self.task, description=phase, completed=completed, total=total)
        else:
            self.progress(phase, completed, total)

    @contextmanager
    def phase(self, name: str, total: int = 1) -> Iterator[None]:
        start = time.perf_counter()
        self.update(name, 0, total)
        yield
        self.update(name, total, total)
        self.seconds[name] = round(time.perf_counter() - start, 3)


# ---------------------------------------------------------------------------------------- train step
class _TrainStep:
    """``step(*params, *buffers, *exp_avg, *exp_avg_sq, *inputs)`` → flat list of results.

    Results: ``[loss, *grads, *new_params, *new_exp_avg, *new_exp_avg_sq, *new_buffers]`` (no optimizer
    state for SGD); a parameter without a gradient keeps its value and state.
    """

    def __init__(self, model: nn.Module, inputs: tuple, loss_fn: LossFn, optimizer: str,
                 model_inputs: int | None = None) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        # inputs[:model_inputs] go to the model; the rest (loss targets) to loss_fn after the model's output
        self.model_inputs = len(inputs) if model_inputs is None else model_inputs
        named = dict(model.named_parameters())
        self.param_names = [k for k, p in named.items() if p.requires_grad]
        self.buffer_names = [k for k, _ in model.named_buffers()]
        self.buffer_names += [k for k, p in named.items() if not p.requires_grad]  # frozen params act as buffers
        self.inputs = inputs
        self.input_slots = [k for k, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
        self.num_states = 2 if optimizer == "adam" else 0

    def tensors(self) -> dict[str, list[torch.Tensor]]:
        named = dict(self.model.named_parameters())
        named.update(self.model.named_buffers())
        params = [named[k] for k in self.param_names]
        return {
            "parameter": params,
            "buffer": [named[k] for k in self.buffer_names],
            "exp_avg": params if self.num_states else [],
            "exp_avg_sq": params if self.num_states else [],
            "input": [self.inputs[k] for k in self.input_slots],
        }

    def split(self, flat: tuple) -> tuple[list, list, list, list, list]:
        p, b = len(self.param_names), len(self.buffer_names)
        s = p if self.num_states else 0
        chunks, start = [], 0
        for size in (p, b, s, s, len(self.input_slots)):
            chunks.append(list(flat[start : start + size]))
            start += size
        return tuple(chunks)  # type: ignore[return-value]

    def __call__(self, *flat: torch.Tensor) -> list:
        params, buffers, exp_avg, exp_avg_sq, tensor_inputs = self.split(flat)
        inputs = list(self.inputs)
        for slot, value in zip(self.input_slots, tensor_inputs):
            inputs[slot] = value
        state = {**dict(zip(self.param_names, params)), **dict(zip(self.buffer_names, buffers))}
        output = torch.func.functional_call(self.model, state, tuple(inputs[:self.model_inputs]))
        loss = self.loss_fn(output, *inputs[self.model_inputs:])
        grads = torch.autograd.grad(loss, params, allow_unused=True) if params else ()
        new_params, new_exp_avg, new_exp_avg_sq = [], [], []
        for k, (param, grad) in enumerate(zip(params, grads)):
            if self.optimizer == "adam":
                if grad is None:
                    new_params.append(param)
                    new_exp_avg.append(exp_avg[k])
                    new_exp_avg_sq.append(exp_avg_sq[k])
                    continue
                p, m, v = _adam_update(param.detach(), grad, exp_avg[k], exp_avg_sq[k])
                new_params.append(p)
                new_exp_avg.append(m)
                new_exp_avg_sq.append(v)
            else:
                new_params.append(param if grad is None else param.detach().add(grad, alpha=-LEARNING_RATE))
        return [loss, *grads, *new_params, *new_exp_avg, *new_exp_avg_sq, *buffers]


def _adam_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                 exp_avg_sq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.optim.Adam's single-tensor update, out of place, at step ADAM_STEP."""
    beta1, beta2 = ADAM_BETAS
    exp_avg = exp_avg.mul(beta1).add(grad, alpha=1 - beta1)
    exp_avg_sq = exp_avg_sq.mul(beta2).addcmul(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**ADAM_STEP
    bias_correction2 = 1 - beta2**ADAM_STEP
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add(ADAM_EPS)
    param = param.addcdiv(exp_avg, denom, value=-LEARNING_RATE / bias_correction1)
    return param, exp_avg, exp_avg_sq


def _train_step(model: nn.Module, example_inputs: tuple, loss_fn: LossFn, optimizer: str = "adam"
                ) -> tuple[Callable[..., list], list[torch.Tensor]]:
    """The train step and its flat arguments on the model's own device (for running it for real).

    Parameters are detached leaves requiring grad; optimizer states are zeros.
    """
    step = _TrainStep(model, tuple(example_inputs), loss_fn, optimizer)
    groups = step.tensors()
    flat = [p.detach().requires_grad_(True) for p in groups["parameter"]]
    flat += [b.detach().clone() for b in groups["buffer"]]
    flat += [torch.zeros_like(p) for p in groups["exp_avg"]] + [torch.zeros_like(p) for p in groups["exp_avg_sq"]]
    flat += groups["input"]
    return step, flat


# ---------------------------------------------------------------------------------------- make_fx
def _batch_norm_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """native_batch_norm mutates its running statistics without saying so in its schema: make the
    update explicit (functional op + copy_) so functionalize turns it into graph outputs."""
    if not training or running_mean is None or running_var is None:
        return NotImplemented
    out, mean, invstd, new_mean, new_var = torch.ops.aten._native_batch_norm_legit_functional.default(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
    return out, mean, invstd


_DECOMPOSITIONS = {torch.ops.aten.native_batch_norm.default: _batch_norm_functional}


def _fake_arguments(step: _TrainStep, fake_mode, *, batch_size: int | None = None) -> list[torch.Tensor]:
    """Fake CPU tensors for the step's flat arguments; ``batch_size`` replaces dim 0 of batch-1 inputs."""
    groups = step.tensors()

    def fake(t: torch.Tensor, requires_grad: bool = False, batch: bool = False) -> torch.Tensor:
        with fake_mode:
            if batch and batch_size is not None and t.dim() > 0 and t.shape[0] == 1:
                value = torch.empty((batch_size, *t.shape[1:]), dtype=t.dtype, device="cpu")
            else:
                value = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")
        return value.requires_grad_(True) if requires_grad else value

    flat = [fake(p, True) for p in groups["parameter"]]
    flat += [fake(b) for b in groups["buffer"]]
    flat += [fake(p) for p in groups["exp_avg"]] + [fake(p) for p in groups["exp_avg_sq"]]
    flat += [fake(x, batch=True) for x in groups["input"]]
    return flat


def _same_layout(a: Any, b: Any) -> bool:
    va, vb = getattr(a, "meta", {}).get("val"), getattr(b, "meta", {}).get("val")
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.shape == vb.shape and va.dtype == vb.dtype


def _mutating_ops(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [
        node for node in graph.nodes
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable
    ]


@contextmanager
def _quiet_fake_tensors() -> Iterator[None]:
    """Mute torch's fake-tensor logger, which logs a traceback for a kernel failure we report in one line."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled


def _make_fx(step: _TrainStep, flat: list, report: _Reporter, name: str) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with report.phase("make_fx"), _quiet_fake_tensors():
            module = make_fx(step, decomposition_table=_DECOMPOSITIONS, tracing_mode="fake", _allow_non_fake_inputs=True)(*flat)
        if _mutating_ops(module.graph):
            with report.phase("functionalize"), _quiet_fake_tensors():
                module = make_fx(torch.func.functionalize(module, remove="mutations"), tracing_mode="fake")(*flat)
    except ModelError:
        raise
    except (Exception, SystemExit) as error:  # the user's forward or loss ran: it may call sys.exit
        detail = describe_failure(error).removeprefix("raised ").splitlines()[0]
        raise ModelError(f"{name}: cannot trace the train step: {detail}") from error
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder":
            # functionalize writes mutated inputs back; the graph outputs already hold the new values
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif node.target is torch.ops.aten.copy.default and _same_layout(node.args[0], node.args[1]):
            node.replace_all_uses_with(node.args[1])  # copy(dst, src) of a same-shaped src is src
            graph.erase_node(node)
    mutating = _mutating_ops(graph)
    if mutating:
        raise ModelError(f"{name}: the traced step still mutates a tensor in place ({mutating[0].target}) after functionalization")
    graph.eliminate_dead_code()
    return module


# ---------------------------------------------------------------------------------------- helpers
def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _desc(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorDesc(tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_desc(v) for v in value)
    return None


def _plain(value: Any, node_ref: Callable[[torch.fx.Node], Any]) -> Any:
    """fx argument → plain Python (lists for immutable lists), nodes through ``node_ref``."""
    if isinstance(value, torch.fx.Node):
        return node_ref(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, node_ref) for v in value] if isinstance(value, list) else tuple(_plain(v, node_ref) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v, node_ref) for k, v in value.items()}
    return value


def _json_constant(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": str(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value)}
    if isinstance(value, (list, tuple)):
        return [_json_constant(v) for v in value]
    return {"repr": repr(value)}


CONSTANT_VALUE_LIMIT = 4096  # elements: larger tensor constants are recorded by shape only


def _output_specs(value: Any) -> list:
    """``[[shape, dtype], ...]`` of the tensors an op returns (one entry for a single tensor)."""
    values = value if isinstance(value, (tuple, list)) else [value]
    return [[list(v.shape), str(v.dtype)] if isinstance(v, torch.Tensor) else None for v in values]


def _constant_value(module: torch.nn.Module, target: str) -> dict[str, Any]:
    """The value of a tensor constant the trace captured (``get_attr``), when it is small and real."""
    value = getattr(module, target, None)
    if not isinstance(value, torch.Tensor) or value.device.type == "meta" or value.numel() > CONSTANT_VALUE_LIMIT:
        return {}
    if isinstance(value, torch._subclasses.fake_tensor.FakeTensor):
        return {}
    return {"value": value.detach().cpu().tolist()}


def _is_view(node: torch.fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if not (target.is_view or str(target) in _ALIAS_OPS):
        return False
    return isinstance(node.meta.get("val"), torch.Tensor)


def _sharded(result: OpResult, out: int | None) -> bool:
    """Whether output ``out`` (None: the whole value) of an analysed op is split along the batch."""
    labels = result.placements
    if labels is None:  # not analysed
        return result.batch_scaled
    if out is not None and isinstance(labels, (tuple, list)):
        labels = labels[out] if out < len(labels) else None
    while isinstance(labels, (tuple, list)):
        labels = next((x for x in labels if x is not None), None)
    return isinstance(labels, str) and labels.startswith("S")


def _ancestors(roots: list[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = [r for r in roots if isinstance(r, torch.fx.Node)]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(node.all_input_nodes)
    return seen


# ---------------------------------------------------------------------------------------- analysis
class _Traced:
    """The functional fx graph of one train step plus what the tracer knows about its nodes."""

    def __init__(self, module: torch.fx.GraphModule, step: _TrainStep, name: str) -> None:
        self.name = name
        self.step = step
        self.module = module
        self.nodes = [n for n in module.graph.nodes if n.op != "output"]
        self.index = {n: i for i, n in enumerate(self.nodes)}
        output = next(n for n in module.graph.nodes if n.op == "output")
        self.outputs = list(output.args[0])
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        p, b = len(step.param_names), len(step.buffer_names)
        s = p if step.num_states else 0
        groups = [("parameter", step.param_names, p), ("buffer", step.buffer_names, b),
                  ("exp_avg", step.param_names, s), ("exp_avg_sq", step.param_names, s),
                  ("input", [str(k) for k in step.input_slots], len(step.input_slots))]
        self.placeholder_kind: dict[torch.fx.Node, str] = {}
        self.placeholder_name: dict[torch.fx.Node, str] = {}
        start = 0
        for group, names, size in groups:
            for k in range(size):
                node = placeholders[start + k]
                self.placeholder_kind[node] = group
                self.placeholder_name[node] = f"{group}:{names[k]}"
            start += size
        first_input = next((n for n in placeholders if self.placeholder_kind[n] == "input" and n.meta["val"].dim() > 0), None)
        if first_input is None:
            raise ModelError(f"{name}: no example input has a batch dimension (dim 0)")
        self.batch_size = int(first_input.meta["val"].shape[0])

    def output_groups(self) -> dict[str, list[Any]]:
        step = self.step
        p, s, b = len(step.param_names), len(step.param_names) if step.num_states else 0, len(step.buffer_names)
        out = self.outputs
        return {
            "loss": out[:1], "grads": out[1 : 1 + p], "params": out[1 + p : 1 + 2 * p],
            "exp_avg": out[1 + 2 * p : 1 + 2 * p + s], "exp_avg_sq": out[1 + 2 * p + s : 1 + 2 * p + 2 * s],
            "buffers": out[1 + 2 * p + 2 * s : 1 + 2 * p + 2 * s + b],
        }

    def roles(self) -> list[int]:
        groups = self.output_groups()
        forward = _ancestors(groups["loss"])
        backward = _ancestors(groups["grads"]) - forward
        optimizer = _ancestors(groups["params"] + groups["exp_avg"] + groups["exp_avg_sq"]) - forward - backward
        roles: list[int] = []
        for node in self.nodes:
            if node.op in ("placeholder", "get_attr"):
                roles.append(_ROLE["input"])
            elif node.target is operator.getitem and roles[self.index[node.args[0]]] == _ROLE["forward"]:
                roles.append(_ROLE["forward"])  # an output of a forward op (e.g. saved statistics) is forward
            elif node in backward:
                roles.append(_ROLE["backward"])
            elif node in optimizer:
                roles.append(_ROLE["optimizer"])
            else:
                roles.append(_ROLE["forward"])
        return roles

    def sharding_records(self, roles: list[int]) -> list[tuple]:
        records: list[tuple] = []
        ref = lambda n: Ref(self.index[n])  # noqa: E731
        for node, role in zip(self.nodes, roles):
            value = node.meta.get("val")
            if node.op == "placeholder":
                sharded = self.placeholder_kind[node] == "input" and value.dim() > 0 and value.shape[0] == self.batch_size
                records.append(("input", _desc(value), sharded))
            elif node.op == "get_attr":
                records.append(("input", _desc(value), False))
            elif node.target is operator.getitem:
                records.append(("getitem", self.index[node.args[0]], int(node.args[1])))
            else:
                records.append(("call", str(node.target), _plain(tuple(node.args), ref), _plain(dict(node.kwargs), ref),
                                _desc(value), role == _ROLE["optimizer"]))
        return records

    def reachability_split(self, roles: list[int]) -> list[OpResult]:
        """Without the DTensor analysis: batch-scaled = reachable from a batch input, class none."""
        scaled = [False] * len(self.nodes)
        for i, node in enumerate(self.nodes):
            if node.op == "placeholder":
                value = node.meta["val"]
                scaled[i] = self.placeholder_kind[node] == "input" and value.dim() > 0
            elif roles[i] != _ROLE["optimizer"]:
                scaled[i] = any(scaled[self.index[n]] for n in node.all_input_nodes)
        return [OpResult("none", s, None, "unanalysed") for s in scaled]


# ---------------------------------------------------------------------------------------- OpGraph build
class _Builder:
    """Folds views into their consumers and writes the OpGraph columns."""

    def __init__(self, traced: _Traced, roles: list[int], sharding: list[OpResult], fold_views: bool,
                 output_specs: bool = False) -> None:
        self.traced = traced
        self.output_specs = output_specs
        self.roles = roles
        self.sharding = sharding
        nodes = traced.nodes
        self.folded = [False] * len(nodes)
        if fold_views:
            for i, node in enumerate(nodes):
                self.folded[i] = self.foldable(node, sharding[i])
        self.op_index: dict[torch.fx.Node, int] = {}
        for node in nodes:
            if not self.folded[traced.index[node]]:
                self.op_index[node] = len(self.op_index)
        self.reads_cache: dict[torch.fx.Node, list[tuple[int, int, float, bool]]] = {}

    def foldable(self, node: torch.fx.Node, result: OpResult) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            return len(node.args[0].users) == 1
        if not _is_view(node):
            return False
        # A view that gathers a sharded input (e.g. a reshape across the batch) stays a node.
        ins = [self.sharding[self.traced.index[n]] for n in node.all_input_nodes]
        return result.source == "unanalysed" or not (result.split == "none" and any(r.batch_scaled for r in ins))

    # ----------------------------------------------------------------- references
    def reads(self, node: torch.fx.Node) -> list[tuple[int, int, float, bool]]:
        """Tensors of kept ops that reading ``node``'s value reads: (op, out, bytes, batch-sharded)."""
        cached = self.reads_cache.get(node)
        if cached is not None:
            return cached
        value_bytes = float(_tensor_bytes(node.meta.get("val")))
        result = self.sharding[self.traced.index[node]]
        if not self.folded[self.traced.index[node]]:
            reads = [(self.op_index[node], 0, value_bytes, _sharded(result, None))]
        elif node.target is operator.getitem:
            producer = self.sharding[self.traced.index[node.args[0]]]
            out = int(node.args[1])
            reads = [(self.op_index[node.args[0]], out, value_bytes, _sharded(producer, out))]
        else:
            scaled = _sharded(result, None)
            reads = [(op, out, min(size, value_bytes), scaled)
                     for parent in node.all_input_nodes for op, out, size, _ in self.reads(parent)]
        self.reads_cache[node] = reads
        return reads

    def reference(self, node: torch.fx.Node) -> dict[str, Any]:
        if not self.folded[self.traced.index[node]]:
            return {"ref": self.op_index[node], "out": 0}
        if node.target is operator.getitem:
            return {"ref": self.op_index[node.args[0]], "out": int(node.args[1])}
        return {"expr": self.call_record(node)}

    def encode(self, value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return self.reference(value)
        if isinstance(value, (list, tuple)):
            return [self.encode(v) for v in value]
        if isinstance(value, dict):
            return {k: self.encode(v) for k, v in value.items()}
        return _json_constant(value)

    def call_record(self, node: torch.fx.Node) -> dict[str, Any]:
        if node.target is operator.getitem:
            return {"target": "getitem", "args": [{"ref": self.op_index[node.args[0]], "out": int(node.args[1])}], "kwargs": {}}
        return {"target": str(node.target), "args": self.encode(list(node.args)), "kwargs": self.encode(dict(node.kwargs))}

    # ----------------------------------------------------------------- columns
    def build(self, meta: dict[str, Any], report: _Reporter) -> OpGraph:
        traced = self.traced
        kept = [n for n in traced.nodes if not self.folded[traced.index[n]]]
        n_ops = len(kept)
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.args: list[dict[str, Any]] = []
        self.columns = {column: np.zeros(n_ops) for column in ("flops", "bytes_accessed", "output_bytes", "param_bytes")}
        self.edges: dict[tuple[int, int], dict[int, float]] = {}  # (producer, consumer) -> {out: bytes}
        self.edge_scaled: dict[tuple[int, int], bool] = {}
        self.flop_totals: Counter = Counter()
        self.fallback_ops: Counter = Counter()
        for k, node in enumerate(kept):
            if k % 2000 == 0:
                report.update("graph", k, n_ops)
            if node.op in ("placeholder", "get_attr"):
                self.add_input(k, node)
            else:
                self.add_call(k, node)
        index = [traced.index[n] for n in kept]
        pairs = sorted(self.edges)
        meta = {**meta, "flops_registry": float(self.flop_totals[FLOP_SOURCE_REGISTRY]),
                "flops_fallback": float(self.flop_totals["fallback"]),
                "flop_fallback_ops": dict(sorted(self.fallback_ops.items())), "outputs": self.output_refs()}
        return OpGraph(
            names=self.names, kinds=self.kinds, role=[self.roles[i] for i in index],
            split=[_SPLIT[self.sharding[i].split] for i in index],
            batch_scaled=[self.sharding[i].batch_scaled for i in index], **self.columns,
            edge_src=np.array([p[0] for p in pairs], dtype=np.int64),
            edge_dst=np.array([p[1] for p in pairs], dtype=np.int64),
            edge_bytes=np.array([sum(self.edges[p].values()) for p in pairs], dtype=np.float64),
            edge_batch_scaled=np.array([self.edge_scaled[p] for p in pairs], dtype=bool),
            batch_size=traced.batch_size, args=self.args, meta=meta,
        )

    def add_input(self, k: int, node: torch.fx.Node) -> None:
        traced = self.traced
        value = node.meta.get("val")
        kind = traced.placeholder_kind.get(node, "constant")
        kind = "optimizer_state" if kind in ("exp_avg", "exp_avg_sq") else kind
        self.names.append(traced.placeholder_name.get(node, node.name))
        self.kinds.append(kind)
        size = _tensor_bytes(value)
        self.columns["output_bytes"][k] = size
        self.columns["param_bytes"][k] = size if kind == "parameter" else 0
        record = {"target": node.op, "name": self.names[-1], "kind": kind, "shape": list(value.shape), "dtype": str(value.dtype)}
        if node.op == "get_attr":
            record.update(_constant_value(traced.module, node.target))
        self.args.append(record)

    def add_call(self, k: int, node: torch.fx.Node) -> None:
        self.names.append(node.name)
        self.kinds.append("getitem" if node.target is operator.getitem else str(node.target))
        record = self.call_record(node)
        if self.output_specs:
            record["outputs"] = _output_specs(node.meta.get("val"))
        self.args.append(record)
        inputs: dict[tuple[int, int], float] = {}  # (producer, output) -> bytes read
        for parent in node.all_input_nodes:
            for op, out, size, scaled in self._call_reads(node, parent):
                inputs[(op, out)] = size
                self.edge_scaled[(op, k)] = self.edge_scaled.get((op, k), False) or scaled
        for (op, out), size in inputs.items():
            self.edges.setdefault((op, k), {})[out] = size
        if node.target is operator.getitem or _is_view(node):
            return  # an alias: no compute, no memory of its own
        output_bytes = _tensor_bytes(node.meta.get("val"))
        self.columns["output_bytes"][k] = output_bytes
        self.columns["bytes_accessed"][k] = output_bytes + sum(inputs.values())
        count, source = self.flops(node)
        self.columns["flops"][k] = count
        self.flop_totals[source.split(":")[0]] += count
        if source != FLOP_SOURCE_REGISTRY:
            self.fallback_ops[f"{self.kinds[-1]} ({source.split(':')[1]})"] += 1

    def _call_reads(self, node: torch.fx.Node, parent: torch.fx.Node) -> list[tuple[int, int, float, bool]]:
        """What ``node`` reads of ``parent``. A getitem reads one element of a multi-output op, not the whole
        tuple: batch norm's saved mean (C floats, whole) must not count as its batch-sized output."""
        if node.target is not operator.getitem:
            return self.reads(parent)
        element_bytes = float(_tensor_bytes(node.meta.get("val")))
        out = int(node.args[1])
        if not self.folded[self.traced.index[parent]]:
            producer = self.sharding[self.traced.index[parent]]
            return [(self.op_index[parent], out, element_bytes, _sharded(producer, out))]
        return [(op, o, min(size, element_bytes), scaled) for op, o, size, scaled in self.reads(parent)]

    def flops(self, node: torch.fx.Node) -> tuple[float, str]:
        if not isinstance(node.target, torch._ops.OpOverload):
            return float(_tensor_bytes(node.meta.get("val")) > 0), "fallback:elementwise"
        value = lambda n: n.meta.get("val")  # noqa: E731
        args = torch.fx.node.map_arg(node.args, value)
        kwargs = torch.fx.node.map_arg(node.kwargs, value)
        try:
            return op_flops(node.target, tuple(args), dict(kwargs), node.meta.get("val"))
        except Exception as error:  # a registry formula that does not take these arguments
            log.warning("flop count of %s failed (%s); counting 0", node.target, error)
            return 0.0, "fallback:failed"

    def output_refs(self) -> dict[str, Any]:
        traced = self.traced
        refs: dict[str, Any] = {}
        names = {"grads": traced.step.param_names, "params": traced.step.param_names, "exp_avg": traced.step.param_names,
                 "exp_avg_sq": traced.step.param_names, "buffers": traced.step.buffer_names}
        for group, values in traced.output_groups().items():
            encoded = [None if v is None else self.encode(v) for v in values]
            refs[group] = encoded[0] if group == "loss" else dict(zip(names[group], encoded))
        return refs


# ---------------------------------------------------------------------------------------- entry points
def _fallback_counts(traced: _Traced, sharding: list[OpResult]) -> dict[str, int]:
    """``"aten.op (rule)" -> count`` of ops whose split class came from a fallback rule."""
    counts = Counter(f"{n.target} ({r.source.split(':', 1)[1]})"
                     for n, r in zip(traced.nodes, sharding) if r.source.startswith("fallback"))
    return dict(sorted(counts.items()))


def _analyse(traced: _Traced, roles: list[int], step: _TrainStep, report: _Reporter) -> list[OpResult]:
    """Split classes of ``traced``'s nodes from the DTensor analysis (see :mod:`tag.graph._sharding`).

    A batch of 1 cannot be sharded, so a batch-1 graph is analysed through a trace at batch 2 with the
    same ops; if the two traces differ, batch scaling falls back to reachability and every class is none.
    """
    analysed = traced
    if traced.batch_size == 1:
        from torch._subclasses.fake_tensor import FakeTensorMode

        flat = _fake_arguments(step, FakeTensorMode(allow_non_fake_inputs=True), batch_size=2)
        analysed = _Traced(_make_fx(step, flat, _Reporter(None), traced.name), step, traced.name)
        if [n.target for n in analysed.nodes] != [n.target for n in traced.nodes]:
            log.warning("%s: the trace at batch 2 differs from the one at batch 1; split classes are not analysed", traced.name)
            return traced.reachability_split(roles)
    records = analysed.sharding_records(roles)
    outputs = sorted({analysed.index[v] for v in analysed.outputs if isinstance(v, torch.fx.Node)})
    try:
        return analyse_sharding(records, analysed.batch_size, outputs)
    except RuntimeError as error:
        message = str(error).splitlines()[0]
        raise ModelError(f"{traced.name}: split-class analysis failed ({message}); trace with split_classes=False") from error


def _check_arguments(model: Any, example_inputs: Any, loss_fn: Any, optimizer: str, name: str) -> tuple:
    if not isinstance(model, nn.Module):
        raise ModelError(f"{name}: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise ModelError(f"{name}: example inputs must be a tuple of tensors, got {type(example_inputs).__name__}")
    example_inputs = tuple(example_inputs)
    if not any(isinstance(x, torch.Tensor) and x.dim() > 0 for x in example_inputs):
        raise ModelError(f"{name}: no example input is a tensor with a batch dimension (dim 0)")
    if not callable(loss_fn):
        raise ModelError(f"{name}: loss_fn must be callable, got {type(loss_fn).__name__}")
    if optimizer not in OPTIMIZERS:
        raise SpecError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelError(f"{name}: the model has no trainable parameters")
    return example_inputs


def _check_targets(targets: Any, example_inputs: tuple, name: str) -> tuple:
    """Loss targets: tensors whose dim 0 is the batch of the first batched example input."""
    if isinstance(targets, torch.Tensor):
        targets = (targets,)
    if not isinstance(targets, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in targets):
        raise ModelError(f"{name}: loss targets must be a tuple of tensors")
    batch = next((x.shape[0] for x in example_inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)
    for k, t in enumerate(targets):
        if t.dim() == 0 or t.shape[0] != batch:
            raise ModelError(f"{name}: loss target {k} has shape {tuple(t.shape)}; its dim 0 must be the batch "
                             f"({batch})")
    return tuple(targets)


def _check_loss(traced: _Traced) -> None:
    loss = traced.outputs[0]
    value = loss.meta.get("val") if isinstance(loss, torch.fx.Node) else loss
    if not isinstance(value, torch.Tensor) or value.dim() != 0 or not value.dtype.is_floating_point:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ModelError(f"{traced.name}: loss_fn must return a floating-point scalar tensor, got {shape}")


def trace(model: nn.Module, example_inputs: tuple, loss_fn: LossFn, *, name: str = "model", optimizer: str = "adam",
          split_classes: bool = True, fold_views: bool = True, output_specs: bool = False,
          progress: Any = None, targets: tuple = ()) -> OpGraph:
    """The OpGraph of one training step of ``model`` (forward, backward, optimizer) at aten level.

    ``example_inputs``: tensors with the batch in dim 0 (their values are never read; ``meta`` works);
    ``loss_fn(model(*example_inputs), *targets)`` must be a scalar: ``targets`` (tensors with the batch in
    dim 0, e.g. labels) are inputs of the step like the model's, placeholders ``input:k`` after them, so a
    replica or micro-batch takes its own rows of them. ``optimizer``: "adam" or "sgd".
    ``split_classes``: run the DTensor split-class analysis (else every op is ``none`` and batch
    scaling follows reachability from the inputs). ``fold_views``: fold zero-cost views, aliases and
    single-use getitems into their consumers. ``output_specs``: record each call's output shapes and dtypes
    in its argument record (for :mod:`tag.execute`). ``progress``: ``fn(phase, completed, total)`` or a rich
    ``Progress``. ModelError if the model cannot be traced.
    """
    example_inputs = _check_arguments(model, example_inputs, loss_fn, optimizer, name)
    targets = _check_targets(targets, example_inputs, name)
    report = _Reporter(progress)
    start = time.perf_counter()
    with report.phase("build"):
        from torch._subclasses.fake_tensor import FakeTensorMode

        step = _TrainStep(model, example_inputs + targets, loss_fn, optimizer, model_inputs=len(example_inputs))
        flat = _fake_arguments(step, FakeTensorMode(allow_non_fake_inputs=True))
    module = _make_fx(step, flat, report, name)
    traced = _Traced(module, step, name)
    _check_loss(traced)
    roles = traced.roles()
    with report.phase("analysis"):
        sharding = _analyse(traced, roles, step, report) if split_classes else traced.reachability_split(roles)
    with report.phase("flops"):
        builder = _Builder(traced, roles, sharding, fold_views, output_specs)
        params = {id(p): p for p in model.parameters()}
        dtype_bytes = next((p.element_size() for p in params.values() if p.dtype.is_floating_point), 4)
        meta = {
            "model": name, "batch_size": traced.batch_size, "parameters": int(sum(p.numel() for p in params.values())),
            "param_dtype_bytes": int(dtype_bytes), "source": "torch", "torch_version": torch.__version__,
            "optimizer": optimizer, "folded_views": int(sum(builder.folded)),
            "split_sources": dict(Counter(r.source for r in sharding)),
            "split_fallback_ops": _fallback_counts(traced, sharding),
        }
        graph = builder.build(meta, report)
    report.seconds["total"] = round(time.perf_counter() - start, 3)
    graph.meta["trace_seconds"] = dict(report.seconds)
    return graph


def trace_zoo(name: str, *, tiny: bool = False, batch_size: int | None = None, **trace_options: Any) -> OpGraph:
    """Trace a zoo model (built on ``meta``) at its paper batch size, or ``batch_size``."""
    from tag.models import get_model

    model, inputs, loss_fn = get_model(name).build(tiny=tiny, batch_size=batch_size, device="meta")
    return trace(model, inputs, loss_fn, name=f"{name}-tiny" if tiny else name, **trace_options)
