"""Batch-split classes (TAG §4.1.1) from DTensor's sharding propagator, run in a child process.

The tracer describes its aten graph as picklable records (:class:`Ref`, :class:`TensorDesc`, plain
Python values). A long-lived worker process creates a fake process group (backend ``"fake"``; it
becomes the global default, hence the separate process) and a 1-D ``DeviceMesh`` over
:func:`mesh_size` replicas, seeds batch inputs with ``Shard(0)`` and everything else with
``Replicate()``, then walks the records in topological order asking
``DTensor._op_dispatcher.sharding_propagator`` for each op's output placements. Per op it answers a
split class, whether the op is batch-scaled, and the placement of each output ("S<d>" sharded on
dim d, "P" partial sum, "R" replicated).

Rules, in the order they are tried for one op:

1. ``reduce_partial`` ops (the optimizer's): partial inputs are all-reduced first (``Partial`` →
   ``Replicate``), so the update consumes the summed gradient; the op is ``none``.
2. Replicated-only ops (no sharded or partial input) and factories: outputs ``Replicate``, class
   ``none``, not batch-scaled: every replica computes them whole (a weight transpose, the Adam
   update, sinusoidal position tables).
3. :data:`OVERRIDE_RULES`: data-parallel practice where it differs from exact semantics (train-mode
   batch norm keeps local statistics, a mean loss is averaged per replica).
4. DTensor's propagator, min-cost strategy: an input that must go from sharded or partial to anything
   else (``Replicate``, another shard dim) makes the op ``none``; otherwise the first output's
   placement gives the class: ``Shard`` → ``concat``, ``Partial`` → ``sum``.
5. :data:`FALLBACK_RULES` for ops without a strategy (or whose strategy fails on these shapes).

A multi-output op's class is that of its first output; each output's own placement is returned
too, so the tracer can class the getitems apart (batch norm: output ``concat``, statistics ``none``).

Then sharding is pulled backwards: a replicated op whose consumers all want its output sharded on
one dim d runs on its slice instead (``concat``, batch-scaled) and asks the same of its producers:
loss targets, position ids broadcast over the batch. Also pulled: an op one consumer wants sharded
whose dim d has the batch's size when every other consumer accepts it sharded without gathering
(the expanded seed of a ``sum()`` loss, read by a bias-gradient reduction that becomes a partial
sum); the graph is then propagated again, at most :data:`_MAX_ROUNDS` times.
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass
from typing import Any

__all__ = ["Ref", "TensorDesc", "OpResult", "analyse_sharding", "mesh_size", "OVERRIDE_RULES", "FALLBACK_RULES"]

WORLD_SIZE = 1 << 20  # ranks of the fake process group; each analysis uses a mesh of the first few


def mesh_size(batch_size: int) -> int:
    """Replicas of the analysis mesh: the smallest prime factor of the batch (2 for a batch of 1), so
    the batch shards evenly (DTensor refuses to merge unevenly sharded dims, e.g. [B, S, H] -> [B*S, H])."""
    for p in range(2, int(batch_size**0.5) + 1):
        if batch_size % p == 0:
            return p
    return min(max(batch_size, 2), WORLD_SIZE)


SHARD0, REPLICATE, PARTIAL = "S0", "R", "P"

OVERRIDE_RULES: dict[str, str] = {
    "batch-norm-train": (
        "train-mode batch norm (native_batch_norm, _native_batch_norm_legit[_functional], "
        "_batch_norm_with_update[_functional]) on a batch-sharded input: the normalised output stays "
        "Shard(0) (local statistics per replica, as DDP does); saved mean/invstd and updated running "
        "statistics are Replicate outputs, i.e. split class none"
    ),
    "loss-backward": (
        "nll_loss_backward / nll_loss2d_backward on a batch-sharded input: grad_input Shard(0), with "
        "total_weight taken as the replica's own (each replica averages its local loss, as DDP does) "
        "instead of all-reducing it first"
    ),
    "batch-norm-backward": (
        "batch-norm backward (native_batch_norm_backward, batch_norm_backward) on batch-sharded "
        "gradients: grad_input Shard(0), grad_weight and grad_bias Partial"
    ),
}

# Ops that work on each sample independently along dim 0 (pooling, upsampling, eval-mode batch
# norm, padding, activations' backward); only used where DTensor has no strategy.
_BATCH_LOCAL_OPS = frozenset(
    {
        "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices",
        "max_pool3d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "avg_pool3d",
        "avg_pool3d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "adaptive_avg_pool2d",
        "_adaptive_avg_pool3d", "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d",
        "adaptive_max_pool2d_backward", "max_pool2d", "upsample_nearest2d", "upsample_nearest2d_backward",
        "upsample_bilinear2d", "upsample_bilinear2d_backward", "_native_batch_norm_legit_no_training",
        "_batch_norm_no_update", "constant_pad_nd", "reflection_pad2d", "reflection_pad2d_backward",
        "replication_pad2d", "replication_pad2d_backward", "im2col", "col2im", "native_dropout",
        "native_dropout_backward", "bernoulli", "threshold_backward", "gelu_backward", "silu_backward",
        "hardtanh_backward", "sigmoid_backward", "tanh_backward", "leaky_relu_backward", "elu_backward",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)

FALLBACK_RULES: dict[str, str] = {
    "batch-local": "ops in _BATCH_LOCAL_OPS: outputs whose dim 0 is the batch stay Shard(0) (concat)",
    "gather": "any other op without a DTensor strategy: sharded/partial inputs are gathered, class none",
}

_BN_TRAIN = frozenset(
    {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
     "_batch_norm_with_update", "_batch_norm_with_update_functional", "cudnn_batch_norm", "miopen_batch_norm"}
)
_BN_BACKWARD = frozenset({"native_batch_norm_backward", "batch_norm_backward", "cudnn_batch_norm_backward"})
_LOSS_BACKWARD = frozenset({"nll_loss_backward", "nll_loss2d_backward"})
_LIKE_FACTORIES = frozenset({"zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like"})
# Factories that read only the dtype and device of their tensor argument.
_NEW_FACTORIES = frozenset({"new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided"})
_BROADCASTS = frozenset({"expand", "expand_copy"})
_MAX_ROUNDS = 4  # propagation rounds: pulling sharding backwards can change a consumer, which is re-propagated


@dataclass(frozen=True)
class Ref:
    """Output ``out`` of record ``node`` (``out`` None: the record's single output)."""

    node: int
    out: int | None = None


@dataclass(frozen=True)
class TensorDesc:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any  # torch.dtype


@dataclass(frozen=True)
class OpResult:
    split: str  # "concat" | "sum" | "none"
    batch_scaled: bool
    placements: Any  # "S<d>" | "P" | "R" | None, nested like the op's outputs
    source: str  # which rule decided: "input", "replicated", "dtensor", "override:...", "fallback:..."


# ---------------------------------------------------------------------------------------------- child


def _placement_label(placement: Any) -> str:
    from torch.distributed.tensor import Partial, Replicate, Shard

    if isinstance(placement, Shard):  # _StridedShard is a Shard
        return f"S{placement.dim}"
    if isinstance(placement, Replicate):
        return REPLICATE
    if isinstance(placement, Partial):
        return PARTIAL if placement.reduce_op in ("sum", "avg") else f"P{placement.reduce_op}"
    return REPLICATE


def _class_of(label: str | None) -> str:
    if label is None or label == REPLICATE:
        return "none"
    if label.startswith("S"):
        return "concat"
    return "sum" if label == PARTIAL else "none"


def _moved(have: str, want: str) -> bool:
    """A redistribution that needs data from other replicas (anything out of Shard or Partial)."""
    return have != want and have != REPLICATE


def _base(target: str) -> str:
    parts = target.split(".")
    return parts[1] if len(parts) >= 3 else parts[-1]


class _Analysis:
    """State of the walk over the records (child side)."""

    def __init__(self, records: list, batch_size: int, outputs: set[int]):
        import torch
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        self.torch = torch
        self.records = records
        self.batch_size = batch_size
        self.outputs = outputs
        self.mesh = DeviceMesh("cpu", list(range(mesh_size(batch_size))))
        self.propagator = DTensor._op_dispatcher.sharding_propagator
        self.placement = {SHARD0: Shard(0), REPLICATE: Replicate(), PARTIAL: Partial()}
        self.pulled: dict[int, tuple[str, list]] = {}  # pulled op -> (output label, [(input, label)])
        self.reset()

    def reset(self) -> None:
        n = len(self.records)
        self.specs: list[Any] = [None] * n
        self.results: list[OpResult | None] = [None] * n
        self.uses: list[list[list]] = [[] for _ in range(n)]  # producer -> [[consumer, out, wanted label]]

    # ----------------------------------------------------------------- specs
    def spec(self, desc: TensorDesc, label: str):
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        placement = self.placement.get(label)
        if placement is None:
            placement = Shard(int(label[1:])) if label.startswith("S") else self.placement[REPLICATE]
        meta = TensorMeta(self.torch.Size(desc.shape), tuple(desc.stride), desc.dtype)
        return DTensorSpec(self.mesh, (placement,), tensor_meta=meta)

    def labels_of(self, spec: Any) -> Any:
        from torch.distributed.tensor._dtensor_spec import DTensorSpec

        if spec is None:
            return None
        if isinstance(spec, DTensorSpec):
            return _placement_label(spec.placements[0])
        return type(spec)(self.labels_of(s) for s in spec) if isinstance(spec, (tuple, list)) else None

    def specs_like(self, out_meta: Any, labels: Any) -> Any:
        """DTensorSpecs for ``out_meta`` (a TensorDesc or a nest of them) with ``labels`` (same nest or one label)."""
        if out_meta is None:
            return None
        if isinstance(out_meta, TensorDesc):
            return self.spec(out_meta, labels if isinstance(labels, str) else REPLICATE)
        if isinstance(labels, (tuple, list)) and len(labels) != len(out_meta):
            labels = _first_label(labels)
        return type(out_meta)(
            self.specs_like(m, labels if isinstance(labels, str) or labels is None else labels[k])
            for k, m in enumerate(out_meta)
        )

    def resolve(self, ref: Ref) -> Any:
        spec = self.specs[ref.node]
        return spec if ref.out is None else spec[ref.out]

    def leading(self, ref: Ref) -> int:
        """Size of dim 0 of a referenced tensor (-1 for scalars)."""
        shape = self.resolve(ref).tensor_meta.shape
        return int(shape[0]) if len(shape) else -1

    def batch_aligned(self, refs: list, have: list, batch_refs: list) -> list:
        """Wanted labels for an override: inputs as long as the batch input along dim 0 are its slices;
        sharded and partial inputs are taken as they are (partials as the replica's own), others whole."""
        batch = self.leading(batch_refs[0])
        return [h if h is None or h != REPLICATE else SHARD0 if self.leading(r) == batch else REPLICATE
                for r, h in zip(refs, have)]

    def batch_dim(self, refs: list, labels: list) -> int:
        return next((self.leading(r) for r, label in zip(refs, labels) if label == SHARD0), -1)

    # ----------------------------------------------------------------- walk
    def run(self) -> list[OpResult]:
        """Propagate, pull sharding backwards, and propagate again while pulling changed a consumer."""
        for _ in range(_MAX_ROUNDS):
            self.reset()
            self.walk()
            if not self.pull_batch_sharding():
                break
        return self.results  # type: ignore[return-value]

    def walk(self) -> None:
        for i, record in enumerate(self.records):
            kind = record[0]
            if kind == "input":
                _, desc, sharded = record
                label = SHARD0 if sharded else REPLICATE
                self.specs[i] = self.spec(desc, label) if desc is not None else None
                self.results[i] = OpResult(_class_of(label), sharded, label if desc is not None else None, "input")
            elif kind == "getitem":
                _, src, k = record
                self.specs[i] = self.specs[src][k]
                label = self.labels_of(self.specs[i])
                self.uses[src].append([i, k, label])
                self.results[i] = OpResult(_class_of(label), bool(label and label.startswith("S")), label, "getitem")
            else:
                self.call(i, record)

    def operands(self, record: tuple, override: dict[int, str] | None = None) -> tuple:
        """(leaves, tree, positions of tensor leaves, refs, current labels) of a call record."""
        from torch.utils._pytree import tree_flatten

        _, _, args, kwargs, _, _ = record
        leaves, tree = tree_flatten((args, kwargs))
        positions = [k for k, leaf in enumerate(leaves) if isinstance(leaf, Ref)]
        refs = [leaves[k] for k in positions]
        have = [self.labels_of(self.resolve(r)) for r in refs]
        if override:
            have = [override.get(r.node, h) if h is not None else None for r, h in zip(refs, have)]
        return leaves, tree, positions, refs, have

    def call(self, i: int, record: tuple) -> None:
        from torch.utils._pytree import tree_unflatten

        _, target, _, _, out_meta, reduce_partial = record
        leaves, tree, positions, refs, have = self.operands(record)
        gathered = reduce_partial and any(h is not None and h.startswith("P") for h in have)
        effective = [REPLICATE if (reduce_partial and h is not None and h.startswith("P")) else h for h in have]
        base = _base(target)
        if i in self.pulled:
            label, demands = self.pulled[i]
            demanded = {(r.node, r.out): d for r, d in demands}
            wanted = [demanded.get((r.node, r.out), e) for r, e in zip(refs, effective)]
            self.finish(i, refs, have, wanted, out_meta, label, gathered, "pulled")
            return
        if all(h in (None, REPLICATE) for h in effective) or base in _NEW_FACTORIES:
            source = "replicated" if refs and base not in _NEW_FACTORIES else "factory"
            self.finish(i, refs, have, effective, out_meta, REPLICATE, gathered, source)
            return
        if base in _BN_TRAIN and effective[0] == SHARD0:
            labels = tuple(SHARD0 if k == 0 else REPLICATE for k in range(len(out_meta)))
            self.finish(i, refs, have, effective, out_meta, labels, gathered, "override:batch-norm-train")
            return
        if base in _BN_BACKWARD and len(effective) > 1 and effective[1] == SHARD0:
            labels = tuple(SHARD0 if k == 0 else PARTIAL for k in range(len(out_meta)))
            wanted = self.batch_aligned(refs, have, refs[1:2])
            self.finish(i, refs, have, wanted, out_meta, labels, gathered, "override:batch-norm-backward")
            return
        if base in _LOSS_BACKWARD and len(effective) > 1 and effective[1] == SHARD0:
            wanted = self.batch_aligned(refs, have, refs[1:2])
            self.finish(i, refs, have, wanted, out_meta, SHARD0, gathered, "override:loss-backward")
            return

        specs_in = [self.resolve(r) if e == h else self.spec_replicate(self.resolve(r)) for r, h, e in zip(refs, have, effective)]
        for pos, spec in zip(positions, specs_in):
            leaves[pos] = spec
        op = _resolve_op(self.torch, target)
        try:
            if op is None:
                raise NotImplementedError(target)
            s_args, s_kwargs = tree_unflatten(leaves, tree)
            wanted, out_labels = self.propagate(op, tuple(s_args), dict(s_kwargs), specs_in, effective)
        except Exception:  # no strategy, or the strategy failed on these shapes: fall back
            self.fallback(i, base, refs, have, effective, out_meta, gathered)
            return
        self.finish(i, refs, have, wanted, out_meta, out_labels, gathered, "dtensor")

    def spec_replicate(self, spec: Any) -> Any:
        from torch.distributed.tensor._dtensor_spec import DTensorSpec

        return DTensorSpec(self.mesh, (self.placement[REPLICATE],), tensor_meta=spec.tensor_meta)

    def propagate(self, op: Any, args: tuple, kwargs: dict, specs_in: list, effective: list) -> tuple[list, Any]:
        """DTensor's choice for one op: (input labels it wants, output labels)."""
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
        from torch.distributed.tensor._op_schema import OpSchema
        from torch.utils._pytree import tree_leaves

        info = self.propagator.op_to_schema_info.get(op) or self.propagator.op_to_schema_info_for_single_dim_strategy.get(op)
        schema = OpSchema(op, args, kwargs, schema_info=info)
        sharding = self.propagator.propagate_op_sharding(schema)
        wanted = list(effective)
        suggestion = sharding.redistribute_schema
        if suggestion is not None:
            suggested = [s for s in tree_leaves((suggestion.args_schema, suggestion.kwargs_schema)) if isinstance(s, DTensorSpec)]
            given = [k for k, s in enumerate(specs_in) if s is not None]
            if len(suggested) == len(given):
                for k, spec in zip(given, suggested):
                    wanted[k] = self.labels_of(spec)
        return wanted, self.labels_of(sharding.output_spec)

    def propagate_record(self, record: tuple, labels: list) -> tuple[list, Any] | None:
        """DTensor's choice for a call record with its inputs at ``labels``; None without a strategy."""
        from torch.utils._pytree import tree_unflatten

        op = _resolve_op(self.torch, record[1])
        if op is None:
            return None
        leaves, tree, positions, refs, _ = self.operands(record)
        specs = []
        for pos, ref, label in zip(positions, refs, labels):
            spec = self.resolve(ref)
            spec = None if spec is None else self.spec(_desc(spec), label)
            leaves[pos] = spec
            specs.append(spec)
        s_args, s_kwargs = tree_unflatten(leaves, tree)
        try:
            return self.propagate(op, tuple(s_args), dict(s_kwargs), specs, list(labels))
        except Exception:
            return None

    def fallback(self, i: int, base: str, refs: list, have: list, effective: list, out_meta: Any, gathered: bool) -> None:
        if base in _BATCH_LOCAL_OPS and all(e in (None, REPLICATE, SHARD0) for e in effective):
            batch = self.batch_dim(refs, effective)
            labels = _map_meta(out_meta, lambda d: SHARD0 if d.shape and d.shape[0] == batch else REPLICATE)
            self.finish(i, refs, have, effective, out_meta, labels, gathered, "fallback:batch-local")
            return
        wanted = [None if e is None else REPLICATE for e in effective]
        self.finish(i, refs, have, wanted, out_meta, REPLICATE, gathered, "fallback:gather")

    def finish(self, i: int, refs: list, have: list, wanted: list, out_meta: Any, out_labels: Any,
               gathered: bool, source: str) -> None:
        for ref, h, w in zip(refs, have, wanted):
            if h is None:
                continue
            self.uses[ref.node].append([i, ref.out, w])
            gathered |= _moved(h, w if w is not None else REPLICATE)
        if isinstance(out_labels, str) or out_labels is None:
            out_labels = _map_meta(out_meta, lambda d: out_labels or REPLICATE)
        self.specs[i] = self.specs_like(out_meta, out_labels)
        labels = self.labels_of(self.specs[i])
        principal = _first_label(labels)
        split = "none" if gathered else _class_of(principal)
        sharded_in = source != "factory" and any(h is not None and h.startswith("S") for h in have)
        batch_scaled = sharded_in or bool(principal and principal.startswith("S"))
        self.results[i] = OpResult(split, batch_scaled, labels, source)

    # ----------------------------------------------------------------- pull pass
    def pull_batch_sharding(self) -> bool:
        """Let replicated ops whose consumers want (or accept) them batch-sharded run on batch slices.

        An op is pulled when every consumer wants its output sharded on one dim d, or when one does,
        dim d has the batch's size, and every other consumer would run without gathering if it got
        the sharded tensor (a reduction over the batch then turns into a partial sum). Returns whether
        a consumer must be propagated again (the second case).
        """
        again = False
        for i in range(len(self.records) - 1, -1, -1):
            record, result = self.records[i], self.results[i]
            if record[0] != "call" or result.source not in ("replicated", "factory") or i in self.outputs or record[5]:
                continue
            out_meta = record[4]
            if not isinstance(out_meta, TensorDesc) or not out_meta.shape:
                continue
            uses = self.uses[i]
            shards = {w for _, _, w in uses if w is not None and w.startswith("S")}
            if len(shards) != 1:
                continue
            label = shards.pop()
            wants = [w == label for _, _, w in uses]
            relaxed = not all(wants)
            if relaxed and (out_meta.shape[int(label[1:])] != self.batch_size or not all(
                    want or self.accepts(consumer, i, label) for (consumer, _, _), want in zip(uses, wants))):
                continue
            demands = self.local_inputs(record, label)
            if demands is None:
                continue
            for ref, demand in demands:
                for use in self.uses[ref.node]:
                    if use[0] == i:
                        use[2] = demand
            self.pulled[i] = (label, demands)
            self.specs[i] = self.spec(out_meta, label)
            self.results[i] = OpResult("concat", True, label, "pulled")
            again |= relaxed
        return again

    def accepts(self, consumer: int, producer: int, label: str) -> bool:
        """Whether ``consumer`` runs without gathering when ``producer``'s output is sharded as ``label``."""
        record = self.records[consumer]
        if record[0] != "call" or self.results[consumer].source not in ("dtensor", "replicated"):
            return False
        _, _, _, refs, have = self.operands(record, {producer: label})
        answer = self.propagate_record(record, have)
        return answer is not None and not any(h is not None and _moved(h, w or REPLICATE) for h, w in zip(have, answer[0]))

    def local_inputs(self, record: tuple, label: str) -> list[tuple[Ref, str]] | None:
        """(input, label) pairs the op needs to make its output slice ``label``; None if it cannot."""
        _, target, _, _, out_meta, _ = record
        _, _, _, refs, have = self.operands(record)
        base = _base(target)
        dim = int(label[1:])
        if not refs or base in _LIKE_FACTORIES or base in _NEW_FACTORIES:
            return []
        if base in _BROADCASTS and dim == 0:
            source = self.resolve(refs[0]).tensor_meta.shape
            if len(out_meta.shape) > len(source) or source[0] == 1:
                return []  # the batch dim is created by the broadcast: each replica makes its own slice
        size = out_meta.shape[dim]
        labels = []
        for ref, h in zip(refs, have):
            shape = () if h is None else self.resolve(ref).tensor_meta.shape
            match = next((k for k, n in enumerate(shape) if n == size), None)
            labels.append(h if match is None else f"S{match}")
        if labels == have:
            return None
        answer = self.propagate_record(record, labels)
        if answer is None or answer[1] != label or answer[0] != labels:
            return None
        return [(r, new) for r, new, old in zip(refs, labels, have) if new != old]


def _desc(spec: Any) -> TensorDesc:
    meta = spec.tensor_meta
    return TensorDesc(tuple(meta.shape), tuple(meta.stride), meta.dtype)


def _map_meta(out_meta: Any, fn) -> Any:
    if out_meta is None:
        return None
    if isinstance(out_meta, TensorDesc):
        return fn(out_meta)
    return type(out_meta)(_map_meta(m, fn) for m in out_meta)


def _first_label(labels: Any) -> str | None:
    if labels is None or isinstance(labels, str):
        return labels
    for label in labels:
        found = _first_label(label)
        if found is not None:
            return found
    return None


def _resolve_op(torch: Any, target: str) -> Any:
    """``"aten.mm.default"`` -> ``torch.ops.aten.mm.default``; None for other targets."""
    parts = target.split(".")
    if len(parts) != 3:
        return None
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return None


def _init_fake_group() -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)


def _read_message(stream) -> Any:
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def _write_message(stream, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def _worker_main() -> None:
    """Child process: answer ("analyse", records, batch_size, outputs) requests until stdin closes."""
    channel_in = os.fdopen(os.dup(0), "rb")
    channel_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from torch go to stderr, never into the protocol
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    _init_fake_group()
    while True:
        request = _read_message(channel_in)
        if request is None:
            return
        try:
            _, records, batch_size, outputs = request
            reply = ("ok", _Analysis(records, batch_size, set(outputs)).run())
        except Exception:
            reply = ("error", traceback.format_exc())
        _write_message(channel_out, reply)


# ---------------------------------------------------------------------------------------------- parent


class _Worker:
    """A child process running :func:`_worker_main`; started on first use, restarted if it dies."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.stderr = None
        self.lock = threading.Lock()

    def start(self) -> None:
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", "1")
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from tag.graph._sharding import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env,
        )

    def request(self, message: Any) -> Any:
        with self.lock:
            for attempt in range(2):
                if self.process is None or self.process.poll() is not None:
                    self.start()
                try:
                    _write_message(self.process.stdin, message)
                    reply = _read_message(self.process.stdout)
                except (BrokenPipeError, OSError):
                    reply = None
                if reply is not None:
                    return reply
                if attempt == 1:
                    raise RuntimeError(f"sharding analysis process died: {self.last_error()}")
                self.close()
        return None

    def last_error(self) -> str:
        if self.stderr is None:
            return "no output"
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
        return lines[-1] if lines else f"exit code {self.process.poll() if self.process else None}"

    def close(self) -> None:
        if self.process is not None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
            self.process = None


_worker = _Worker()
atexit.register(_worker.close)


def analyse_sharding(records: list, batch_size: int, outputs: list[int]) -> list[OpResult]:
    """Split class, batch scaling and output placements of every record, computed in the worker.

    ``records[i]`` is one of ``("input", TensorDesc | None, batch_sharded)``, ``("getitem", src, k)``
    or ``("call", "aten.name.overload", args, kwargs, out_meta, reduce_partial)`` where args/kwargs
    hold :class:`Ref` for tensors and out_meta nests :class:`TensorDesc`; records are in topological
    order. ``outputs``: records whose value leaves the graph. RuntimeError if the worker fails.
    """
    status, payload = _worker.request(("analyse", records, batch_size, list(outputs)))
    if status != "ok":
        raise RuntimeError(f"sharding analysis failed:\n{payload}")
    return payload
