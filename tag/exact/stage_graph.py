"""The forward view that the exact partitioners cut, and the StageGraph they hand to mapping and the simulator.

**What is partitioned.** Pipeline stages are cut through the forward ops only; every other op follows
one forward op, its *owner*, and is contracted onto it (:func:`assign_owners`):

- **name pairing** first: PipeDream graphs name ``nodeN.forward`` / ``nodeN.backward`` /
  ``nodeN.optimizer``, so ``X.backward`` and ``X.optimizer`` follow ``X.forward``;
- an **input** op (parameter, data) follows the first forward op in topological order that reads it
  (a parameter lives with the first stage that needs it; a tied weight read again by a later stage is
  not copied, a simplification);
- a traced **backward** op, which carries no pairing, follows the forward op f it most likely
  differentiates. It reads *saved* tensors: outputs of forward or input ops p, each of which the op f
  either produced (f = p) or consumed (f is a forward consumer of p). So f is scored by how many of the
  saved tensors it touches this way; ties go first to an f one of whose forward consumers owns a
  gradient the op reads (the gradient of f's output comes from f's consumers), then to one that owns
  such a gradient itself, then to the latest f in topological order. A backward op that reads no saved
  tensor (a gradient sum, a view) follows the earliest owner among its gradient inputs; one with no
  input at all (the seed gradient) follows the last forward op;
- an **optimizer** op follows the parameter it updates, else the earliest owner among its inputs;
- anything left (optimizer state, step counters) follows its earliest owned neighbour.

**Costs.** Times come from the cost model, split into a fixed part (launch overheads and weight reads,
:meth:`CostModel.linear_times`; ops that do not scale with the batch) and a part linear in the batch
fraction, so a stage's time at any micro-batch is ``fixed + fraction · scaled`` (the same affine law
:meth:`CostModel.op_times` applies op by op).
Activations kept for backward are the outputs of forward and data-input ops that some backward op
reads (every forward output when the graph has no backward ops). Edges between forward ops carry the
activations; edges out of parameters and optimizer state carry none (weights do not travel between
stages).

**StageGraph fields** (S stages, E stage edges, N ops, T GPU types):
``stage_time [S]`` fwd + bwd seconds of one micro-batch share of one replica on the reference GPU type;
``edge_src/edge_dst [E]`` stage ids, ``edge_bytes [E]`` activation bytes one replica of the source stage
sends per micro-batch in the forward pass (the gradient of the same size returns in the backward pass);
``param_bytes [S]`` one copy of the stage's parameters; ``memory_bytes [S]`` per device of the stage
under 1F1B (parameters × 4 for fp32 Adam: weights, gradients, two moments; plus the activations of the
micro-batches in flight, min(S − s, M) at stage s); ``assignment [N]`` the stage of every op.

**Links** (:data:`LINKS`). ``"data"``: a stage edge a → b for every pair of stages an activation
passes between, sent directly (Parmesan's stage graph, skip connections included). ``"chain"``: a
sequential pipeline's runtime (PipeDream; GraphPipe's SPP): stage s sends only to s + 1, which waits
for it, so the edges are s → s + 1 and each carries every activation crossing the cut after stage s,
passed through the stages in between — a tensor crosses a cut once, however many later stages read
it (its largest edge from the producer counts). The chain executes the stages in sequence even where
the data would allow branches to run side by side (GraphPipe §2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tag.cluster.gpus import GPUType, gpu_type
from tag.cost.compute import CostModel
from tag.errors import TagError
from tag.exact.buckets import GradientBuckets, gradient_buckets
from tag.graph.opgraph import (
    ROLE_BACKWARD,
    ROLE_FORWARD,
    ROLE_INPUT,
    ROLE_OPTIMIZER,
    SPLIT_CONCAT,
    OpGraph,
)
from tag.strategy.pipeline_plan import LINKS, MAX_MICRO_BATCHES  # the plan file's vocabulary, defined below us

__all__ = [
    "PartitionError",
    "ForwardGraph",
    "StageGraph",
    "assign_owners",
    "build_stage_graph",
    "inflight_micro_batches",
    "ADAM_MEMORY_COPIES",
    "SCHEDULES",
    "LINKS",
]

# fp32 Adam keeps the weights, their gradients and two moments: four copies of the parameters.
ADAM_MEMORY_COPIES = 4
SCHEDULES = ("1f1b", "gpipe")
_STATEFUL_KINDS = frozenset({"parameter", "optimizer_state"})
_NONE = -1


class PartitionError(TagError):
    """A partitioning request cannot be met: too many stages, no feasible split, a bad argument."""


def inflight_micro_batches(num_stages: int, micro_batches: int, schedule: str = "1f1b") -> np.ndarray:
    """[S] micro-batches whose activations a stage holds at its peak: min(S − s, M) under 1F1B, M under
    GPipe (stage s, 0-based)."""
    if schedule not in SCHEDULES:
        raise PartitionError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "gpipe":
        return np.full(num_stages, micro_batches, dtype=np.int64)
    return np.minimum(num_stages - np.arange(num_stages), micro_batches).astype(np.int64)


# ------------------------------------------------------------------------------------------- ownership


def _stateful(graph: OpGraph) -> np.ndarray:
    """[N] bool: parameters and optimizer state (inputs that are not data)."""
    kinds = np.array([k in _STATEFUL_KINDS for k in graph.kinds], dtype=bool)
    return (graph.role == ROLE_INPUT) & (kinds | (graph.param_bytes > 0))


def _name_pairs(graph: OpGraph) -> np.ndarray:
    """[N] op id of the ``X.forward`` op named like ``X.backward`` / ``X.optimizer``; -1 where none."""
    paired = np.full(graph.num_ops, _NONE, dtype=np.int64)
    index = {name: i for i, name in enumerate(graph.names)}
    for i, name in enumerate(graph.names):
        stem, dot, suffix = name.rpartition(".")
        if dot and suffix in ("backward", "optimizer"):
            j = index.get(f"{stem}.forward")
            if j is not None and graph.role[j] == ROLE_FORWARD:
                paired[i] = j
    return paired


def assign_owners(graph: OpGraph) -> np.ndarray:
    """[N] op id of the forward op each op follows (a forward op follows itself); rules in the module
    docstring. Raises PartitionError when the graph has no forward op."""
    forward = np.flatnonzero(graph.role == ROLE_FORWARD)
    if forward.size == 0:
        raise PartitionError("the graph has no forward ops to cut into stages")
    order = graph.topological_order()
    position = np.empty(graph.num_ops, dtype=np.int64)
    position[order] = np.arange(graph.num_ops)
    role = graph.role
    owner = np.full(graph.num_ops, _NONE, dtype=np.int64)
    owner[forward] = forward
    paired = _name_pairs(graph)
    owner[paired >= 0] = paired[paired >= 0]

    succ = [graph.successors(v).tolist() for v in range(graph.num_ops)]
    pred = [graph.predecessors(v).tolist() for v in range(graph.num_ops)]
    fwd_consumers = [[c for c in succ[v] if role[c] == ROLE_FORWARD] for v in range(graph.num_ops)]
    for v in np.flatnonzero((role == ROLE_INPUT) & (owner < 0)):
        if fwd_consumers[v]:
            owner[v] = min(fwd_consumers[v], key=position.__getitem__)
    stateful = _stateful(graph)
    last_forward = int(forward[np.argmax(position[forward])])
    for v in order.tolist():
        if owner[v] >= 0:
            continue
        if role[v] == ROLE_BACKWARD:
            owner[v] = _backward_owner(v, pred[v], role, owner, position, fwd_consumers, last_forward)
        elif role[v] == ROLE_OPTIMIZER:
            params = [owner[p] for p in pred[v] if stateful[p] and graph.param_bytes[p] > 0 and owner[p] >= 0]
            known = params or [owner[p] for p in pred[v] if owner[p] >= 0]
            if known:
                owner[v] = min(known, key=position.__getitem__)
    _fill_from_neighbours(owner, pred, succ, position, int(forward[np.argmin(position[forward])]))
    return owner


def _backward_owner(op: int, preds: list[int], role: np.ndarray, owner: np.ndarray, position: np.ndarray,
                    fwd_consumers: list[list[int]], last_forward: int) -> int:
    saved = [p for p in preds if role[p] in (ROLE_FORWARD, ROLE_INPUT) and owner[p] >= 0]
    grads = {int(owner[q]) for q in preds if role[q] != ROLE_FORWARD and role[q] != ROLE_INPUT and owner[q] >= 0}
    if not saved:
        return min(grads, key=position.__getitem__) if grads else last_forward
    touched: dict[int, int] = {}
    for p in saved:
        reach = fwd_consumers[p] + ([p] if role[p] == ROLE_FORWARD else [])
        for f in set(reach):
            touched[f] = touched.get(f, 0) + 1
    if not touched:  # inputs read only by non-forward ops
        return int(owner[max(saved, key=position.__getitem__)])

    def score(f: int) -> tuple[int, bool, bool, int]:
        return touched[f], any(g in grads for g in fwd_consumers[f]), f in grads, int(position[f])

    return max(touched, key=score)


def _fill_from_neighbours(owner: np.ndarray, pred: list[list[int]], succ: list[list[int]], position: np.ndarray,
                          fallback: int) -> None:
    """Give every op still unowned the owner of its earliest owned neighbour, to a fixpoint."""
    pending = [int(v) for v in np.flatnonzero(owner < 0)]
    while pending:
        left = []
        for v in pending:
            known = [owner[u] for u in pred[v] + succ[v] if owner[u] >= 0]
            if known:
                owner[v] = min(known, key=position.__getitem__)
            else:
                left.append(v)
        if len(left) == len(pending):
            owner[left] = fallback
            break
        pending = left


# ------------------------------------------------------------------------------------------- forward view


@dataclass(eq=False)
class ForwardGraph:
    """F forward ops (indices in topological order) with every other op contracted onto its owner.

    Build with :meth:`from_graph`. E edges between forward ops, T GPU types; times at the reference
    batch (``batch_size``), in seconds, per op on each GPU type.
    """

    graph: OpGraph  # the N-op graph
    forward_ops: np.ndarray  # [F] op id of each forward op, topological order
    owner: np.ndarray  # [N] forward index 0..F-1 each op follows
    edge_src: np.ndarray  # [E] forward index, edge_src < edge_dst
    edge_dst: np.ndarray  # [E]
    edge_scaled: np.ndarray  # [E] bytes at the reference batch that scale with the batch
    edge_fixed: np.ndarray  # [E] bytes that do not
    gpu_types: tuple[GPUType, ...]  # [T]
    fwd_fixed: np.ndarray  # [F, T] seconds
    fwd_scaled: np.ndarray  # [F, T]
    bwd_fixed: np.ndarray  # [F, T]
    bwd_scaled: np.ndarray  # [F, T]
    optimizer_time: np.ndarray  # [F, T] once per iteration, not per micro-batch
    param_bytes: np.ndarray  # [F]
    act_fixed: np.ndarray  # [F] bytes kept for backward that do not scale
    act_scaled: np.ndarray  # [F] bytes kept for backward at the reference batch that scale
    cost: CostModel = field(default_factory=CostModel)

    @classmethod
    def from_graph(cls, graph: OpGraph, gpus: Sequence[GPUType | str], *,
                   cost: CostModel | None = None) -> ForwardGraph:
        cost = cost if cost is not None else CostModel()
        types = tuple(g if isinstance(g, GPUType) else gpu_type(g) for g in gpus)
        if not types:
            raise PartitionError("no GPU types given to time the stages on")
        owner_op = assign_owners(graph)
        order = graph.topological_order()
        forward_ops = order[graph.role[order] == ROLE_FORWARD]
        index = np.full(graph.num_ops, _NONE, dtype=np.int64)
        index[forward_ops] = np.arange(forward_ops.size)
        owner = index[owner_op]
        num = forward_ops.size
        role = graph.role

        def per_owner(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
            return np.bincount(owner[mask], weights=values[mask], minlength=num)

        columns: dict[str, list[np.ndarray]] = {k: [] for k in ("ff", "fs", "bf", "bs", "opt")}
        for gpu in types:
            fixed, scaled = cost.linear_times(graph, gpu)
            fwd = (role == ROLE_FORWARD) | (role == ROLE_INPUT)
            columns["ff"].append(per_owner(fixed, fwd))
            columns["fs"].append(per_owner(scaled, fwd))
            columns["bf"].append(per_owner(fixed, role == ROLE_BACKWARD))
            columns["bs"].append(per_owner(scaled, role == ROLE_BACKWARD))
            columns["opt"].append(per_owner(fixed + scaled, role == ROLE_OPTIMIZER))
        table = {k: np.stack(v, axis=1) for k, v in columns.items()}

        stateful = _stateful(graph)
        kept = _kept_for_backward(graph, stateful)
        out_scales = graph.batch_scaled & (graph.split == SPLIT_CONCAT)
        act_scaled = per_owner(graph.output_bytes, kept & out_scales)
        act_fixed = per_owner(graph.output_bytes, kept & ~out_scales)

        src_op, dst_op = graph.edge_src, graph.edge_dst
        carries = ((role[src_op] == ROLE_FORWARD) | ((role[src_op] == ROLE_INPUT) & ~stateful[src_op])) \
            & (role[dst_op] == ROLE_FORWARD)
        src, dst = owner[src_op[carries]], owner[dst_op[carries]]
        scaled_edge = graph.edge_batch_scaled[carries]
        nbytes = graph.edge_bytes[carries]
        keep = src != dst
        pair = src[keep] * num + dst[keep]
        pairs, inverse = np.unique(pair, return_inverse=True)
        edge_scaled = np.bincount(inverse, weights=np.where(scaled_edge[keep], nbytes[keep], 0.0), minlength=pairs.size)
        edge_fixed = np.bincount(inverse, weights=np.where(scaled_edge[keep], 0.0, nbytes[keep]), minlength=pairs.size)
        return cls(graph=graph, forward_ops=forward_ops, owner=owner, edge_src=pairs // num, edge_dst=pairs % num,
                   edge_scaled=edge_scaled, edge_fixed=edge_fixed, gpu_types=types,
                   fwd_fixed=table["ff"], fwd_scaled=table["fs"], bwd_fixed=table["bf"], bwd_scaled=table["bs"],
                   optimizer_time=table["opt"], param_bytes=per_owner(graph.param_bytes, np.ones(graph.num_ops, bool)),
                   act_fixed=act_fixed, act_scaled=act_scaled, cost=cost)

    @property
    def num_nodes(self) -> int:
        return int(self.forward_ops.size)

    @property
    def batch_size(self) -> int:
        return self.graph.batch_size

    def type_index(self, gpu: GPUType | str | int) -> int:
        if isinstance(gpu, (int, np.integer)):
            return int(gpu)
        gpu = gpu if isinstance(gpu, GPUType) else gpu_type(gpu)
        return self.gpu_types.index(gpu)

    def forward_time(self, fraction: float, gpu: GPUType | str | int = 0) -> np.ndarray:
        """[F] seconds of each forward op (with its owned inputs) on ``fraction`` of the reference batch."""
        t = self.type_index(gpu)
        return self.fwd_fixed[:, t] + fraction * self.fwd_scaled[:, t]

    def backward_time(self, fraction: float, gpu: GPUType | str | int = 0) -> np.ndarray:
        t = self.type_index(gpu)
        return self.bwd_fixed[:, t] + fraction * self.bwd_scaled[:, t]

    def compute_time(self, fraction: float, gpu: GPUType | str | int = 0) -> np.ndarray:
        """[F] forward + backward seconds per node."""
        return self.forward_time(fraction, gpu) + self.backward_time(fraction, gpu)

    def edge_bytes(self, fraction: float) -> np.ndarray:
        """[E] bytes of each edge on ``fraction`` of the reference batch."""
        return self.edge_fixed + fraction * self.edge_scaled

    def activation_bytes(self, fraction: float) -> np.ndarray:
        """[F] bytes each node keeps for its backward pass, per micro-batch of ``fraction``."""
        return self.act_fixed + fraction * self.act_scaled

    def static_bytes(self) -> np.ndarray:
        """[F] parameters, gradients and Adam moments."""
        return ADAM_MEMORY_COPIES * self.param_bytes


def _kept_for_backward(graph: OpGraph, stateful: np.ndarray) -> np.ndarray:
    """[N] bool: forward or data-input ops whose output a backward op reads (all forward ops when the
    graph has no backward op)."""
    role = graph.role
    if not (role == ROLE_BACKWARD).any():
        return role == ROLE_FORWARD
    src, dst = graph.edge_src, graph.edge_dst
    feeds = ((role[src] == ROLE_FORWARD) | (role[src] == ROLE_INPUT)) & (role[dst] == ROLE_BACKWARD) & ~stateful[src]
    kept = np.zeros(graph.num_ops, dtype=bool)
    kept[src[feeds]] = True
    return kept


# ------------------------------------------------------------------------------------------- stage graph


@dataclass(eq=False)
class StageGraph:
    """S pipeline stages and the activations between them; fields in the module docstring."""

    stage_time: np.ndarray  # [S] fwd + bwd seconds per micro-batch share of one replica, reference GPU
    edge_src: np.ndarray  # [E] stage id
    edge_dst: np.ndarray  # [E] stage id, > edge_src
    edge_bytes: np.ndarray  # [E] forward bytes per micro-batch sent by one replica of edge_src
    param_bytes: np.ndarray  # [S] one copy of the stage's parameters
    memory_bytes: np.ndarray  # [S] per device of the stage under 1F1B
    assignment: np.ndarray  # [N] stage of every op of the OpGraph
    replicas: np.ndarray  # [S] devices holding a copy of each stage
    micro_batches: int  # M
    gpu_types: tuple[GPUType, ...]  # [T]
    reference_type: int  # index into gpu_types that stage_time is timed on
    forward_time: np.ndarray  # [S, T] seconds per micro-batch share of one replica
    backward_time: np.ndarray  # [S, T]
    optimizer_time: np.ndarray  # [S, T] once per iteration
    activation_bytes: np.ndarray  # [S] kept for backward per micro-batch and replica
    input_bytes: np.ndarray  # [S] received from earlier stages per micro-batch and replica
    forward_assignment: np.ndarray  # [F] stage of every forward op, in topological order
    info: dict[str, Any] = field(default_factory=dict)
    # each stage's backward pass in pieces, one per parameter node (tag.exact.buckets); None: one piece
    buckets: GradientBuckets | None = None

    @property
    def num_stages(self) -> int:
        return int(self.stage_time.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edge_src.shape[0])

    def memory(self, schedule: str = "1f1b") -> np.ndarray:
        """[S] bytes per device of each stage under ``schedule``."""
        inflight = inflight_micro_batches(self.num_stages, self.micro_batches, schedule)
        return ADAM_MEMORY_COPIES * self.param_bytes + inflight * (self.activation_bytes + self.input_bytes)

    @property
    def stage_time_by_type(self) -> np.ndarray:
        """[S, T] fwd + bwd seconds per micro-batch share of one replica on each GPU type of ``gpu_types``."""
        return self.forward_time + self.backward_time

    @property
    def iteration_stage_time(self) -> np.ndarray:
        """[S] seconds of all M micro-batches of one replica on the reference GPU type (per iteration,
        the unit of a gradient all-reduce)."""
        return self.micro_batches * self.stage_time

    @property
    def iteration_edge_bytes(self) -> np.ndarray:
        """[E] bytes a replica pair moves per iteration over each edge, activations and gradients."""
        return 2.0 * self.micro_batches * self.edge_bytes

    def stage_times_on(self, gpu: GPUType | str) -> np.ndarray:
        """[S] fwd + bwd seconds per micro-batch share on another GPU type of ``gpu_types``."""
        gpu = gpu if isinstance(gpu, GPUType) else gpu_type(gpu)
        t = self.gpu_types.index(gpu)
        return self.forward_time[:, t] + self.backward_time[:, t]

    def summary(self) -> dict[str, Any]:
        return {
            "stages": self.num_stages,
            "replicas": self.replicas.tolist(),
            "micro_batches": self.micro_batches,
            "stage_time_s": self.stage_time.tolist(),
            "max_stage_time_s": float(self.stage_time.max()),
            "edge_bytes": float(self.edge_bytes.sum()),
            "param_bytes": self.param_bytes.tolist(),
            "memory_bytes": self.memory_bytes.tolist(),
        }

    def __repr__(self) -> str:
        return (f"StageGraph({self.num_stages} stages x {self.replicas.tolist()} replicas, M={self.micro_batches}, "
                f"max stage {self.stage_time.max() * 1e3:.3g} ms, {self.num_edges} edges)")


def _replica_counts(replicas: int | Sequence[int], num_stages: int) -> np.ndarray:
    counts = np.full(num_stages, replicas, dtype=np.int64) if np.isscalar(replicas) else \
        np.asarray(replicas, dtype=np.int64).reshape(-1)
    if counts.shape != (num_stages,) or (counts < 1).any():
        raise PartitionError(f"replicas must be a positive int or one positive int per stage ({num_stages}), "
                             f"got {replicas!r}")
    return counts


def _chain_links(fg: ForwardGraph, forward_stage: np.ndarray, fraction: np.ndarray,
                 num_stages: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(edge_src [S-1], edge_dst [S-1], edge_bytes [S-1], input_bytes [S]) of the chain s → s + 1
    (module docstring, Links): per cut, every producer's tensor read after the cut, once."""
    first, last = forward_stage[fg.edge_src], forward_stage[fg.edge_dst]  # [E]
    cross = first < last
    first, last, producer = first[cross], last[cross], fg.edge_src[cross]
    fixed, scaled = fg.edge_fixed[cross], fg.edge_scaled[cross]
    span = last - first  # the edge crosses the cuts first .. last - 1
    edge = np.repeat(np.arange(span.size), span)  # [P] one entry per (edge, cut crossed)
    cut = first[edge] + np.arange(edge.size) - np.repeat(np.cumsum(span) - span, span)
    size = fixed[edge] + scaled[edge]
    key = producer[edge] * num_stages + cut
    order = np.lexsort((size, key))  # by key, largest size last
    keep = order[np.r_[key[order][1:] != key[order][:-1], True]] if order.size else order
    edge, cut = edge[keep], cut[keep]
    sent = np.bincount(cut, weights=fixed[edge] + fraction[cut] * scaled[edge], minlength=num_stages - 1)
    received = np.bincount(cut, weights=fixed[edge] + fraction[cut + 1] * scaled[edge], minlength=num_stages - 1)
    chain = np.arange(num_stages - 1, dtype=np.int64)
    return chain, chain + 1, sent[:num_stages - 1], np.r_[0.0, received[:num_stages - 1]]


def build_stage_graph(fg: ForwardGraph, forward_stage: Sequence[int] | np.ndarray, *,
                      replicas: int | Sequence[int] = 1, micro_batches: int = 1, reference_type: int = 0,
                      links: str = "data", info: dict[str, Any] | None = None) -> StageGraph:
    """The StageGraph of a stage per forward node (ids 0..S-1, each used, edges never going back);
    ``links``: the stage edges, ``"data"`` or ``"chain"`` (module docstring)."""
    if links not in LINKS:
        raise PartitionError(f"links must be one of {', '.join(LINKS)}, got {links!r}")
    forward_stage = np.asarray(forward_stage, dtype=np.int64).reshape(-1)
    if forward_stage.shape != (fg.num_nodes,):
        raise PartitionError(f"forward_stage has {forward_stage.size} entries for {fg.num_nodes} forward ops")
    num_stages = int(forward_stage.max()) + 1
    if forward_stage.min() < 0 or (np.bincount(forward_stage, minlength=num_stages) == 0).any():
        raise PartitionError("stage ids must be 0..S-1 with every stage holding a forward op")
    if (forward_stage[fg.edge_src] > forward_stage[fg.edge_dst]).any():
        k = int(np.argmax(forward_stage[fg.edge_src] > forward_stage[fg.edge_dst]))
        raise PartitionError(f"edge {int(fg.edge_src[k])} -> {int(fg.edge_dst[k])} goes from stage "
                             f"{forward_stage[fg.edge_src[k]]} back to {forward_stage[fg.edge_dst[k]]}")
    if not 1 <= micro_batches <= MAX_MICRO_BATCHES:
        raise PartitionError(f"micro_batches must be an integer in 1..{MAX_MICRO_BATCHES}, got {micro_batches!r}")
    counts = _replica_counts(replicas, num_stages)
    fraction = 1.0 / (micro_batches * counts)  # [S] of the reference batch per micro-batch and replica
    node_fraction = fraction[forward_stage]  # [F]

    def per_stage(values: np.ndarray) -> np.ndarray:
        return np.bincount(forward_stage, weights=values, minlength=num_stages)

    num_types = len(fg.gpu_types)
    fwd = np.stack([per_stage(fg.fwd_fixed[:, t] + node_fraction * fg.fwd_scaled[:, t]) for t in range(num_types)], 1)
    bwd = np.stack([per_stage(fg.bwd_fixed[:, t] + node_fraction * fg.bwd_scaled[:, t]) for t in range(num_types)], 1)
    opt = np.stack([per_stage(fg.optimizer_time[:, t]) for t in range(num_types)], axis=1)
    activation = per_stage(fg.act_fixed + node_fraction * fg.act_scaled)
    if links == "chain":
        edge_src, edge_dst, edge_bytes, input_bytes = _chain_links(fg, forward_stage, fraction, num_stages)
    else:
        s_src, s_dst = forward_stage[fg.edge_src], forward_stage[fg.edge_dst]
        cross = s_src != s_dst
        pair = s_src[cross] * num_stages + s_dst[cross]
        pairs, inverse = np.unique(pair, return_inverse=True)
        sent = fg.edge_fixed[cross] + fraction[s_src[cross]] * fg.edge_scaled[cross]
        received = fg.edge_fixed[cross] + fraction[s_dst[cross]] * fg.edge_scaled[cross]
        edge_bytes = np.bincount(inverse, weights=sent, minlength=pairs.size)
        input_bytes = np.bincount(s_dst[cross], weights=received, minlength=num_stages)
        edge_src, edge_dst = pairs // num_stages, pairs % num_stages
    param_bytes = per_stage(fg.param_bytes)
    inflight = inflight_micro_batches(num_stages, micro_batches, "1f1b")
    return StageGraph(
        stage_time=fwd[:, reference_type] + bwd[:, reference_type],
        edge_src=edge_src, edge_dst=edge_dst, edge_bytes=edge_bytes,
        param_bytes=param_bytes,
        memory_bytes=ADAM_MEMORY_COPIES * param_bytes + inflight * (activation + input_bytes),
        assignment=forward_stage[fg.owner], replicas=counts, micro_batches=int(micro_batches),
        gpu_types=fg.gpu_types, reference_type=int(reference_type), forward_time=fwd, backward_time=bwd,
        optimizer_time=opt, activation_bytes=activation, input_bytes=input_bytes,
        forward_assignment=forward_stage.copy(), info={**(info or {}), "links": links},
        buckets=gradient_buckets(forward_stage, np.stack([fg.bwd_fixed[:, t] + node_fraction * fg.bwd_scaled[:, t]
                                                          for t in range(num_types)], 1),
                                 fg.param_bytes, fg.optimizer_time),
    )

