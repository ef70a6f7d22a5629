"""GroupGraph: op groups as the planners see them (TAG §4.1.1: "each op group is regarded as a single node").

G groups of an N-op graph: the quotient OpGraph (:meth:`OpGraph.contract`; a DAG, group ids in a
topological order), the op → group assignment, the members of each group (CSR), group compute times
per GPU type from the cost model, parameter bytes, and the boundary tensors (op edges between groups).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np

from tag._arrays import csr_by_key
from tag.cluster.cluster import Cluster
from tag.cluster.gpus import GPUType, gpu_type
from tag.cost.compute import CostModel
from tag.errors import GraphError
from tag.graph.opgraph import OpGraph
from tag.grouping.errors import GroupingError

__all__ = ["GroupGraph", "BoundaryTensors", "DEFAULT_GPUS", "resolve_gpus"]

# The GPU type whose times weigh ops when no cluster is given: the PipeDream profiles were measured on it.
DEFAULT_GPUS = ("v100-16gb",)

GpuSpec = Cluster | Sequence[GPUType | str] | None


def resolve_gpus(gpus: GpuSpec) -> tuple[GPUType, ...]:
    """The GPU types of a cluster, a list of types or catalogue names, or (None) :data:`DEFAULT_GPUS`."""
    if gpus is None:
        gpus = DEFAULT_GPUS
    if isinstance(gpus, Cluster):
        return tuple(gpus.types)
    if isinstance(gpus, (str, GPUType)):
        gpus = (gpus,)
    types = tuple(g if isinstance(g, GPUType) else gpu_type(g) for g in gpus)
    if not types:
        raise GroupingError("no GPU types given to time the op groups on")
    return types


class BoundaryTensors(NamedTuple):
    """The B op edges whose ends lie in different groups: the tensors a strategy may have to move."""

    edge: np.ndarray  # [B] int64 op-edge id in the op graph
    src_op: np.ndarray  # [B] int64
    dst_op: np.ndarray  # [B] int64
    src_group: np.ndarray  # [B] int64
    dst_group: np.ndarray  # [B] int64
    bytes: np.ndarray  # [B] float64 at the reference batch
    batch_scaled: np.ndarray  # [B] bool: grows with the batch (split along it between replicas)


@dataclass(eq=False)
class GroupGraph:
    """N ops in G groups. Build with :func:`tag.grouping.group_ops` or :meth:`from_assignment`.

    Derived on construction: ``members`` [N] (op ids grouped by group, ascending within one) and
    ``member_ptr`` [G+1], the CSR of each group's ops; ``boundary``, the :class:`BoundaryTensors`.
    """

    op_graph: OpGraph  # the N-op graph that was grouped
    graph: OpGraph  # the G-node quotient (OpGraph.contract), a DAG; group_ops numbers it topologically
    assignment: np.ndarray  # [N] int64 group of each op
    gpu_types: tuple[GPUType, ...]  # [T] the types compute_time is given for
    compute_time: np.ndarray  # [G, T] float64 seconds of each group at the reference batch
    cost: CostModel = field(default_factory=CostModel)
    info: dict[str, Any] = field(default_factory=dict)  # how the grouping was made (method, cuts, counts)

    def __post_init__(self) -> None:
        self.assignment = np.asarray(self.assignment, dtype=np.int64)
        if self.assignment.shape != (self.op_graph.num_ops,):
            raise GraphError(f"assignment has shape {self.assignment.shape}, expected ({self.op_graph.num_ops},)")
        # [G+1], [N] op ids grouped by group, ascending within a group
        self.member_ptr, self.members = csr_by_key(self.num_groups, self.assignment)
        if self.compute_time.shape != (self.num_groups, len(self.gpu_types)):
            raise GraphError(f"compute_time has shape {self.compute_time.shape}, expected "
                             f"({self.num_groups}, {len(self.gpu_types)})")
        self.boundary = self._boundary()
        self._tables: dict[GPUType, np.ndarray] = {t: self.compute_time[:, k] for k, t in enumerate(self.gpu_types)}

    @classmethod
    def from_assignment(cls, op_graph: OpGraph, assignment: np.ndarray, *, gpus: GpuSpec = None,
                        cost: CostModel | None = None, info: dict[str, Any] | None = None) -> GroupGraph:
        """Group ``op_graph`` by ``assignment`` [N] (ids 0..G-1, no gaps; the quotient must be a DAG).

        Group ids are kept as given; :func:`group_ops` gives them in a topological order.
        """
        cost = cost if cost is not None else CostModel()
        types = resolve_gpus(gpus)
        assignment = np.asarray(assignment, dtype=np.int64)
        graph = op_graph.contract(assignment)
        compute = _group_times(op_graph, assignment, graph.num_ops, types, cost)
        return cls(op_graph, graph, assignment, types, compute, cost, dict(info or {}))

    # ------------------------------------------------------------------ sizes and members
    @property
    def num_groups(self) -> int:
        return self.graph.num_ops

    @property
    def param_bytes(self) -> np.ndarray:
        """[G] bytes of parameters owned by the ops of each group."""
        return self.graph.param_bytes

    @property
    def flops(self) -> np.ndarray:
        """[G] FLOP of each group at the reference batch."""
        return self.graph.flops

    def group_members(self, group: int) -> np.ndarray:
        """Op ids of ``group``, ascending."""
        return self.members[self.member_ptr[group] : self.member_ptr[group + 1]]

    def group_sizes(self) -> np.ndarray:
        """[G] number of ops in each group."""
        return np.diff(self.member_ptr)

    # ------------------------------------------------------------------ compute times
    def mean_compute_time(self) -> np.ndarray:
        """[G] compute seconds averaged over the GPU types (TAG Table 1's group compute feature)."""
        return self.compute_time.mean(axis=1)

    def order_by_compute(self) -> np.ndarray:
        """[G] group ids in descending mean compute time, ties by id: MCTS's level order (TAG §4.2.2)."""
        return np.lexsort((np.arange(self.num_groups), -self.mean_compute_time()))

    def compute_table(self, gpus: GpuSpec) -> np.ndarray:
        """[G, T'] group compute seconds on other GPU types (a cluster's ``types``, catalogue names).

        Columns are cached per type: one pass of the cost model over the ops and one bincount each.
        """
        types = resolve_gpus(gpus)
        missing = [t for t in types if t not in self._tables]
        if missing:
            table = _group_times(self.op_graph, self.assignment, self.num_groups, missing, self.cost)
            self._tables.update({t: table[:, k] for k, t in enumerate(missing)})
        return np.stack([self._tables[t] for t in types], axis=1)

    def with_gpus(self, gpus: GpuSpec) -> GroupGraph:
        """The same grouping with ``compute_time`` for other GPU types (shares the graphs and arrays)."""
        types = resolve_gpus(gpus)
        other = GroupGraph(self.op_graph, self.graph, self.assignment, types, self.compute_table(types),
                           self.cost, dict(self.info))
        other._tables.update(self._tables)
        return other

    # ------------------------------------------------------------------ quality
    def cut_bytes(self) -> float:
        """Bytes of all boundary tensors at the reference batch."""
        return float(self.boundary.bytes.sum())

    def balance(self) -> float:
        """max / mean of the groups' mean compute time (1 is perfectly balanced)."""
        times = self.mean_compute_time()
        mean = times.mean() if times.size else 0.0
        return float(times.max() / mean) if mean > 0 else 1.0

    def _boundary(self) -> BoundaryTensors:
        g = self.op_graph
        src_group, dst_group = self.assignment[g.edge_src], self.assignment[g.edge_dst]
        edge = np.flatnonzero(src_group != dst_group)
        return BoundaryTensors(edge, g.edge_src[edge], g.edge_dst[edge], src_group[edge], dst_group[edge],
                               g.edge_bytes[edge], g.edge_batch_scaled[edge])

    def __repr__(self) -> str:
        return (f"GroupGraph({self.op_graph.meta.get('model', '?')!r}, ops={self.op_graph.num_ops}, "
                f"groups={self.num_groups}, cut={self.cut_bytes():.3g} B, balance={self.balance():.2f})")


def _group_times(op_graph: OpGraph, assignment: np.ndarray, num_groups: int, types: Sequence[GPUType],
                 cost: CostModel) -> np.ndarray:
    """[G, T] sums of op times per group."""
    op_times = cost.op_time_table(op_graph, list(types))  # [N, T]
    return np.stack([np.bincount(assignment, weights=op_times[:, k], minlength=num_groups)
                     for k in range(len(types))], axis=1) if types else np.zeros((num_groups, 0))
