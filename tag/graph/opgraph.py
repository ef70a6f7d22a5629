"""OpGraph: the computation graph every planner reads.

A DAG of ops stored column-wise in numpy arrays, with CSR adjacency built once. Per op: kind (aten
target or layer name), role, FLOPs and bytes accessed at the reference batch size, output bytes,
parameter bytes it owns, whether cost and output scale with the batch, and the batch-split class of
TAG §4.1.1. Per edge: bytes at the reference batch size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from tag._arrays import csr_by_key
from tag._compiled import kahn_least_first
from tag.errors import GraphError

__all__ = [
    "OpGraph",
    "ROLES",
    "SPLIT_CLASSES",
    "ROLE_INPUT",
    "ROLE_FORWARD",
    "ROLE_BACKWARD",
    "ROLE_OPTIMIZER",
    "SPLIT_CONCAT",
    "SPLIT_SUM",
    "SPLIT_NONE",
]

ROLES = ("input", "forward", "backward", "optimizer")
ROLE_INPUT, ROLE_FORWARD, ROLE_BACKWARD, ROLE_OPTIMIZER = range(4)

# TAG §4.1.1: how an op's output can be split across replicas along the batch.
SPLIT_CLASSES = ("concat", "sum", "none")
SPLIT_CONCAT, SPLIT_SUM, SPLIT_NONE = range(3)

# Far past any tensor (even at a batch of 2^31); larger byte counts are typos whose sums in the memory
# model (Adam keeps 4 copies of each parameter) would overflow to infinity.
MAX_BYTES = 2.0**100
_FLOAT_COLUMNS = ("flops", "bytes_accessed", "output_bytes", "param_bytes", "measured_time")


@dataclass(eq=False)
class OpGraph:
    """A DAG of ops in column arrays. N ops, E edges.

    Float columns are at the reference ``batch_size``; ``measured_time`` is NaN unless a profile
    measured the op (seconds on ``meta["measured_on"]`` at the reference batch).
    """

    names: list[str]
    kinds: list[str]
    role: np.ndarray  # [N] int8, index into ROLES
    flops: np.ndarray  # [N] float64, FLOP at the reference batch
    bytes_accessed: np.ndarray  # [N] float64, bytes read + written
    output_bytes: np.ndarray  # [N] float64, bytes of all outputs
    param_bytes: np.ndarray  # [N] float64, bytes of parameters the op owns
    batch_scaled: np.ndarray  # [N] bool, cost and output linear in the batch
    split: np.ndarray  # [N] int8, index into SPLIT_CLASSES
    edge_src: np.ndarray  # [E] int64
    edge_dst: np.ndarray  # [E] int64
    edge_bytes: np.ndarray  # [E] float64
    batch_size: int = 1
    measured_time: np.ndarray | None = None  # [N] float64 seconds or NaN
    args: list[Any] | None = None  # [N] JSON-able op call (aten target, arguments) for an executor
    meta: dict[str, Any] = field(default_factory=dict)
    # [E] bool: the edge's bytes grow with the batch. Default: the producer is batch-scaled and its
    # output is split by concatenation (a partial sum over the batch, e.g. a weight gradient, does not grow).
    edge_batch_scaled: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.names)
        self.role = np.asarray(self.role, dtype=np.int8)
        self.split = np.asarray(self.split, dtype=np.int8)
        self.batch_scaled = np.asarray(self.batch_scaled, dtype=bool)
        for name in ("flops", "bytes_accessed", "output_bytes", "param_bytes"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        if self.measured_time is None:
            self.measured_time = np.full(n, np.nan)
        self.measured_time = np.asarray(self.measured_time, dtype=np.float64)
        self.edge_src = np.asarray(self.edge_src, dtype=np.int64).reshape(-1)
        self.edge_dst = np.asarray(self.edge_dst, dtype=np.int64).reshape(-1)
        self.edge_bytes = np.asarray(self.edge_bytes, dtype=np.float64).reshape(-1)
        if self.edge_batch_scaled is None:
            valid = (self.edge_src >= 0) & (self.edge_src < n)
            src = np.where(valid, self.edge_src, 0)
            self.edge_batch_scaled = valid & self.batch_scaled[src] & (self.split[src] == SPLIT_CONCAT) if n else np.zeros(0, bool)
        self.edge_batch_scaled = np.asarray(self.edge_batch_scaled, dtype=bool).reshape(-1)
        self.validate()
        self.succ_ptr, self.succ_edge = csr_by_key(n, self.edge_src)  # [N+1], [E] edge ids by source
        self.succ = self.edge_dst[self.succ_edge]  # [E] successor ops
        self.pred_ptr, self.pred_edge = csr_by_key(n, self.edge_dst)
        self.pred = self.edge_src[self.pred_edge]

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise GraphError naming the first problem: lengths, ranges, negative sizes, self loops."""
        n = len(self.names)
        if len(self.kinds) != n:
            raise GraphError(f"graph has {n} op names but {len(self.kinds)} kinds")
        for column in ("role", "split", "batch_scaled", *_FLOAT_COLUMNS):
            value = getattr(self, column)
            if value.shape != (n,):
                raise GraphError(f"column {column!r} has shape {value.shape}, expected ({n},)")
        if self.args is not None and len(self.args) != n:
            raise GraphError(f"graph has {n} ops but {len(self.args)} argument records")
        if len(set(self.names)) != n:
            seen: set[str] = set()
            duplicate = next(x for x in self.names if x in seen or seen.add(x))
            raise GraphError(f"op name {duplicate!r} appears more than once")
        if n and (self.role.min() < 0 or self.role.max() >= len(ROLES)):
            raise GraphError(f"op {self.names[int(np.argmax((self.role < 0) | (self.role >= len(ROLES))))]!r}: role out of range")
        if n and (self.split.min() < 0 or self.split.max() >= len(SPLIT_CLASSES)):
            raise GraphError(f"op {self.names[int(np.argmax((self.split < 0) | (self.split >= 3)))]!r}: split class out of range")
        for column in ("flops", "bytes_accessed", "output_bytes", "param_bytes"):
            values = getattr(self, column)
            bad = ~np.isfinite(values) | (values < 0)
            if bad.any():
                i = int(np.argmax(bad))
                raise GraphError(f"op {self.names[i]!r}: {column} must be a finite non-negative number, got {values[i]!r}")
            if column != "flops" and (values > MAX_BYTES).any():
                i = int(np.argmax(values > MAX_BYTES))
                raise GraphError(f"op {self.names[i]!r}: {column} must be at most 2^100 bytes, got {float(values[i])!r}")
        measured = self.measured_time[~np.isnan(self.measured_time)]
        if (measured < 0).any() or not np.isfinite(measured).all():
            raise GraphError("measured_time must be non-negative")
        e = self.edge_src.shape[0]
        if self.edge_dst.shape != (e,) or self.edge_bytes.shape != (e,) or self.edge_batch_scaled.shape != (e,):
            raise GraphError("edge_src, edge_dst, edge_bytes and edge_batch_scaled must have the same length")
        for end, column in (("source", self.edge_src), ("target", self.edge_dst)):
            bad = (column < 0) | (column >= n)
            if bad.any():
                k = int(np.argmax(bad))
                raise GraphError(f"edge {k}: {end} {int(column[k])} is not an op (graph has {n} ops)")
        bad = ~np.isfinite(self.edge_bytes) | (self.edge_bytes < 0) | (self.edge_bytes > MAX_BYTES)
        if bad.any():
            k = int(np.argmax(bad))
            raise GraphError(
                f"edge {self.names[self.edge_src[k]]!r} -> {self.names[self.edge_dst[k]]!r}: "
                f"bytes must be a finite non-negative number at most 2^100, got {float(self.edge_bytes[k])!r}"
            )
        loops = self.edge_src == self.edge_dst
        if loops.any():
            raise GraphError(f"op {self.names[self.edge_src[int(np.argmax(loops))]]!r} has an edge to itself")
        if self.batch_size < 1:
            raise GraphError(f"batch_size must be a positive integer, got {self.batch_size!r}")

    # ------------------------------------------------------------------ basic queries
    @property
    def num_ops(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return int(self.edge_src.shape[0])

    def successors(self, op: int) -> np.ndarray:
        return self.succ[self.succ_ptr[op] : self.succ_ptr[op + 1]]

    def predecessors(self, op: int) -> np.ndarray:
        return self.pred[self.pred_ptr[op] : self.pred_ptr[op + 1]]

    def out_degree(self) -> np.ndarray:
        return np.diff(self.succ_ptr)  # [N]

    def in_degree(self) -> np.ndarray:
        return np.diff(self.pred_ptr)  # [N]

    def index(self, name: str) -> int:
        try:
            return self._name_index()[name]
        except KeyError:
            raise GraphError(f"no op named {name!r}") from None

    def _name_index(self) -> dict[str, int]:
        cached = self.__dict__.get("_names_to_index")
        if cached is None:
            cached = {name: i for i, name in enumerate(self.names)}
            self.__dict__["_names_to_index"] = cached
        return cached

    def count_by_role(self) -> dict[str, int]:
        counts = np.bincount(self.role, minlength=len(ROLES))
        return {role: int(counts[i]) for i, role in enumerate(ROLES)}

    def total_flops(self) -> float:
        return float(self.flops.sum())

    def total_param_bytes(self) -> float:
        return float(self.param_bytes.sum())

    @property
    def parameters(self) -> int:
        """Parameter count: recorded by the source, else parameter bytes / dtype size."""
        if "parameters" in self.meta:
            return int(self.meta["parameters"])
        return int(round(self.total_param_bytes() / self.meta.get("param_dtype_bytes", 4)))

    # ------------------------------------------------------------------ structure
    def fixed_bytes(self) -> np.ndarray:
        """[N] bytes an op moves that do not shrink with its share of the batch: the parameters it owns
        or reads over edges that do not scale (weights), and its output where none of its out-edges
        scales (a weight gradient); 0 for input ops, which launch no kernel. A GEMM on a micro-batch
        still reads its whole weight matrix."""
        fixed = self.param_bytes.copy()
        np.add.at(fixed, self.edge_dst, np.where(self.edge_batch_scaled, 0.0, self.edge_bytes))
        outputs = np.zeros(self.num_ops, dtype=np.int64)
        scaled_out = np.zeros(self.num_ops, dtype=np.int64)
        np.add.at(outputs, self.edge_src, 1)
        np.add.at(scaled_out, self.edge_src, self.edge_batch_scaled.astype(np.int64))
        fixed += np.where((outputs > 0) & (scaled_out == 0), self.output_bytes, 0.0)
        return np.where(self.role == ROLE_INPUT, 0.0, fixed)

    def topological_order(self) -> np.ndarray:
        """Kahn's order, ties broken by op index; GraphError naming an op on a cycle."""
        indegree = self.in_degree()  # [N] (a new array) consumed, left positive on the ops Kahn's could not place
        order, placed = kahn_least_first(self.succ_ptr, self.succ, indegree)
        if placed != self.num_ops:
            cycle = self._find_cycle(indegree > 0)
            path = " -> ".join(repr(self.names[i]) for i in cycle)
            raise GraphError(f"graph has a cycle: {path}")
        return order

    def _find_cycle(self, candidates: np.ndarray) -> list[int]:
        """One cycle among ``candidates`` (ops left with positive in-degree by Kahn's algorithm)."""
        start = int(np.flatnonzero(candidates)[0])
        # Every remaining op has a remaining predecessor: walk predecessors until one repeats.
        seen: dict[int, int] = {}
        walk: list[int] = []
        op = start
        while op not in seen:
            seen[op] = len(walk)
            walk.append(op)
            op = next(int(p) for p in self.predecessors(op) if candidates[p])
        cycle = walk[seen[op] :]
        cycle.reverse()
        return cycle + [cycle[0]]

    def is_dag(self) -> bool:
        try:
            self.topological_order()
        except GraphError:
            return False
        return True

    def _take(self, keep: np.ndarray, edge_keep: np.ndarray, new_index: np.ndarray, **meta: Any) -> OpGraph:
        return OpGraph(
            names=[self.names[i] for i in keep],
            kinds=[self.kinds[i] for i in keep],
            role=self.role[keep],
            flops=self.flops[keep],
            bytes_accessed=self.bytes_accessed[keep],
            output_bytes=self.output_bytes[keep],
            param_bytes=self.param_bytes[keep],
            batch_scaled=self.batch_scaled[keep],
            split=self.split[keep],
            edge_src=new_index[self.edge_src[edge_keep]],
            edge_dst=new_index[self.edge_dst[edge_keep]],
            edge_bytes=self.edge_bytes[edge_keep],
            edge_batch_scaled=self.edge_batch_scaled[edge_keep],
            batch_size=self.batch_size,
            measured_time=self.measured_time[keep],
            args=None,
            meta={**self.meta, **meta},
        )

    def subgraph(self, ops: Iterable[int] | np.ndarray) -> OpGraph:
        """The induced subgraph on ``ops`` (indices or a boolean mask), ops kept in index order."""
        ops = np.asarray(list(ops) if not isinstance(ops, np.ndarray) else ops)
        mask = ops.astype(bool) if ops.dtype == bool else np.zeros(self.num_ops, dtype=bool)
        if ops.dtype != bool:
            if ops.size and (ops.min() < 0 or ops.max() >= self.num_ops):
                raise GraphError(f"subgraph: op index out of range 0..{self.num_ops - 1}")
            mask[ops.astype(np.int64)] = True
        elif mask.shape != (self.num_ops,):
            raise GraphError(f"subgraph: mask has shape {mask.shape}, expected ({self.num_ops},)")
        keep = np.flatnonzero(mask)
        new_index = np.full(self.num_ops, -1, dtype=np.int64)
        new_index[keep] = np.arange(keep.size)
        edge_keep = mask[self.edge_src] & mask[self.edge_dst]
        graph = self._take(keep, edge_keep, new_index)
        graph.args = None if self.args is None else [self.args[i] for i in keep]
        return graph

    def contract(self, assignment: Sequence[int] | np.ndarray, *, names: Sequence[str] | None = None) -> OpGraph:
        """The quotient graph of a group assignment [N] → group id in 0..G-1.

        Group columns are sums of their ops; a group is batch-scaled if any member is; its split class
        is the most restrictive of its members (none > sum > concat). Edges between two groups are
        merged with their bytes summed. GraphError if the quotient has a cycle.
        """
        assignment = np.asarray(assignment, dtype=np.int64)
        if assignment.shape != (self.num_ops,):
            raise GraphError(f"contract: assignment has shape {assignment.shape}, expected ({self.num_ops},)")
        if self.num_ops and assignment.min() < 0:
            raise GraphError("contract: group ids must be non-negative")
        num_groups = int(assignment.max()) + 1 if self.num_ops else 0
        sizes = np.bincount(assignment, minlength=num_groups)
        if (sizes == 0).any():
            raise GraphError(f"contract: group {int(np.argmax(sizes == 0))} has no ops (ids must be 0..G-1 without gaps)")

        def total(column: np.ndarray) -> np.ndarray:
            return np.bincount(assignment, weights=column, minlength=num_groups)

        role = np.zeros(num_groups, dtype=np.int8)
        split = np.zeros(num_groups, dtype=np.int8)
        batch_scaled = np.zeros(num_groups, dtype=bool)
        np.maximum.at(split, assignment, self.split)
        np.logical_or.at(batch_scaled, assignment, self.batch_scaled)
        # A group's role is the role of most of its compute (ties to the lower role index).
        role_flops = np.zeros((num_groups, len(ROLES)))
        np.add.at(role_flops, (assignment, self.role), self.flops + 1e-9)
        role[:] = np.argmax(role_flops, axis=1)
        measured = self.measured_time.copy()
        has_measured = ~np.isnan(measured)
        measured[~has_measured] = 0.0
        group_measured = total(measured)
        group_measured[np.bincount(assignment, weights=has_measured, minlength=num_groups) == 0] = np.nan

        src, dst = assignment[self.edge_src], assignment[self.edge_dst]
        cross = src != dst
        pair = src[cross] * num_groups + dst[cross]
        unique_pairs, inverse = np.unique(pair, return_inverse=True)
        pair_bytes = np.bincount(inverse, weights=self.edge_bytes[cross], minlength=unique_pairs.size)
        scaled_bytes = np.bincount(inverse, weights=self.edge_bytes[cross] * self.edge_batch_scaled[cross], minlength=unique_pairs.size)
        # A merged edge carries tensors of both kinds; it is batch-scaled when most of its bytes are.
        pair_scaled = scaled_bytes * 2 > pair_bytes
        group_names = list(names) if names is not None else [f"group{g}" for g in range(num_groups)]
        if len(group_names) != num_groups:
            raise GraphError(f"contract: {len(group_names)} names for {num_groups} groups")
        graph = OpGraph(
            names=group_names,
            kinds=["group"] * num_groups,
            role=role,
            flops=total(self.flops),
            bytes_accessed=total(self.bytes_accessed),
            output_bytes=total(self.output_bytes),
            param_bytes=total(self.param_bytes),
            batch_scaled=batch_scaled,
            split=split,
            edge_src=unique_pairs // num_groups,
            edge_dst=unique_pairs % num_groups,
            edge_bytes=pair_bytes,
            edge_batch_scaled=pair_scaled,
            batch_size=self.batch_size,
            measured_time=group_measured,
            meta={**self.meta, "contracted_from": self.num_ops},
        )
        graph.topological_order()  # raises on a cyclic quotient
        return graph

    def to_networkx(self):
        """A networkx.DiGraph with node index ids and every column as an attribute."""
        import networkx as nx

        g = nx.DiGraph(name=self.meta.get("model", ""), batch_size=self.batch_size)
        for i in range(self.num_ops):
            g.add_node(
                i,
                name=self.names[i],
                kind=self.kinds[i],
                role=ROLES[self.role[i]],
                flops=float(self.flops[i]),
                bytes_accessed=float(self.bytes_accessed[i]),
                output_bytes=float(self.output_bytes[i]),
                param_bytes=float(self.param_bytes[i]),
                batch_scaled=bool(self.batch_scaled[i]),
                split=SPLIT_CLASSES[self.split[i]],
                measured_time=float(self.measured_time[i]),
            )
        for k in range(self.num_edges):
            g.add_edge(int(self.edge_src[k]), int(self.edge_dst[k]), bytes=float(self.edge_bytes[k]),
                       batch_scaled=bool(self.edge_batch_scaled[k]))
        return g

    def with_batch_size(self, batch_size: int) -> OpGraph:
        """The same graph at another reference batch: batch-scaled columns and edges scale linearly."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= 2**31:
            raise GraphError(f"batch_size must be an integer in 1..2^31, got {batch_size!r}")
        ratio = batch_size / self.batch_size
        scale = np.where(self.batch_scaled, ratio, 1.0)
        output_scale = np.where(self.batch_scaled & (self.split == SPLIT_CONCAT), ratio, 1.0)
        edge_scale = np.where(self.edge_batch_scaled, ratio, 1.0)
        graph = dataclasses.replace(
            self,
            flops=self.flops * scale,
            bytes_accessed=self.bytes_accessed * scale,
            output_bytes=self.output_bytes * output_scale,
            edge_bytes=self.edge_bytes * edge_scale,
            measured_time=self.measured_time * scale,
            batch_size=batch_size,
            # The traced call records hold shapes at the old batch: an executor must re-trace.
            args=None,
            meta={**self.meta, "batch_size": batch_size, "rescaled_from_batch": self.batch_size},
        )
        return graph

    def __repr__(self) -> str:
        roles = ", ".join(f"{k}={v}" for k, v in self.count_by_role().items())
        return f"OpGraph({self.meta.get('model', '?')!r}, ops={self.num_ops} ({roles}), edges={self.num_edges}, batch={self.batch_size})"
