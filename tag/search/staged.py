"""A memory-fitting starting plan: contiguous runs of layers on disjoint sets of device groups (model
parallelism between the sets, data parallelism within each).

When a model's activations and optimizer state do not fit one device at its share of the batch, every
data-parallel plan runs out of memory, and so does the search's default fill (which starts from
DP-NCCL). TAG's answer is model parallelism; a random walk over 2^M − 1 masks per group rarely stumbles
on a combination that fits. This module builds one directly:

1. Op groups are ordered by the layer they belong to (:func:`layer_positions`: a backward or optimizer
   op sits with the forward op it differentiates, so a layer's forward, backward and update stay
   together) and cut into contiguous runs, each on its own set of device groups. The run on a set of k
   devices costs Σ_g t[g, slowest type] / k (its batch share, the slowest device pacing) plus a ring
   all-reduce of its parameters at the set's slowest link; the plan runs one batch at a time, so an
   iteration costs the sum over runs. A dynamic programme over (layer position, device groups used)
   minimises that sum subject to every device's memory estimate staying under its budget.
2. Memory per device of a run: 4 × its parameter bytes (weights, gradients, two Adam moments) plus the
   activations of its forward ops divided among the k replicas. Not every forward output is kept for
   backward, so the activations are scaled to match one simulation of data parallelism on every device.
3. The estimate ignores transient buffers, so the plan is simulated; each device group that overflows
   has its budget lowered by its overflow ratio and the programme is solved again, a few rounds at most.

:func:`staged_strategy` returns the first plan the simulator finds feasible, or None. The planner starts a
search from it (the "staged" default fill) and keeps it as a candidate of its final pass.
"""

from __future__ import annotations

import numpy as np

from tag.cluster import Cluster
from tag.compiler import CompilerCache, evaluate_strategy
from tag.compiler.compile import ADAM_COPIES
from tag.cost import CostModel
from tag.graph.opgraph import ROLES
from tag.grouping import GroupGraph
from tag.strategy import ALLREDUCE, Strategy

__all__ = ["staged_strategy", "group_memory", "layer_positions"]

FORWARD, BACKWARD = ROLES.index("forward"), ROLES.index("backward")
INITIAL_BUDGET = 0.9  # of each device's memory, before the simulator has said anything
MAX_ROUNDS = 8  # solve → simulate → lower the budgets of devices that overflowed
MAX_SUBSET_GROUPS = 8  # runs on any set of device groups up to this many device groups (3^M pairs)
_INFEASIBLE = np.inf


def group_memory(group_graph: GroupGraph) -> tuple[np.ndarray, np.ndarray]:
    """(persistent [G], activations [G]) bytes: 4 × parameter bytes per replica, and the outputs of the
    group's batch-scaled forward ops at the graph's batch (kept for backward, split among replicas)."""
    graph = group_graph.op_graph
    kept = np.where((graph.role == FORWARD) & graph.batch_scaled, graph.output_bytes, 0.0)  # [N]
    activations = np.bincount(group_graph.assignment, weights=kept, minlength=group_graph.num_groups)
    return ADAM_COPIES * group_graph.param_bytes, activations


def layer_positions(group_graph: GroupGraph) -> np.ndarray:
    """[G] each group's median layer position: forward ops are numbered in topological order; a backward op
    takes the latest forward op it reads (the activation it differentiates) or, reading none, the earliest
    position among its inputs (gradients flow from later layers to earlier); other ops take the earliest
    position among their inputs, and ops without any (inputs, parameters) that of their first forward
    consumer (else of their first consumer)."""
    graph = group_graph.op_graph
    topo = graph.topological_order()
    position = np.full(graph.num_ops, np.nan)  # [N]
    forward = graph.role == FORWARD
    position[topo[forward[topo]]] = np.arange(int(forward.sum()))
    for op in topo[~forward[topo]].tolist():
        preds = graph.predecessors(op)
        known = preds[np.isfinite(position[preds])]
        if not len(known):
            continue
        read = known[forward[known]]
        position[op] = position[read].max() if graph.role[op] == BACKWARD and len(read) else position[known].min()
    for op in topo[::-1].tolist():
        if np.isnan(position[op]):
            succs = graph.successors(op)
            known = succs[np.isfinite(position[succs])]
            read_by = known[forward[known]]  # a weight belongs with the layer that reads it, not its update
            position[op] = position[read_by if len(read_by) else known].min() if len(known) else 0.0
    return np.array([np.median(position[group_graph.group_members(g)]) for g in range(group_graph.num_groups)])


def staged_strategy(group_graph: GroupGraph, cluster: Cluster, *, cost: CostModel | None = None,
                    granularity: str = "group", batch_split: str = "even", max_rounds: int = MAX_ROUNDS,
                    cache: CompilerCache | None = None) -> Strategy | None:
    """A plan of contiguous group runs on device groups that the simulator finds feasible (module
    docstring), or None when no budget the rounds reach gives one."""
    members = [np.flatnonzero(cluster.device_group == m) for m in range(cluster.num_device_groups)]
    capacity = np.array([cluster.memory_bytes()[d].min() for d in members])  # [M] the smallest member's
    sequence = np.argsort(layer_positions(group_graph), kind="stable")  # [G] groups in layer order
    persistent, activations = group_memory(group_graph)
    cache = cache if cache is not None else CompilerCache()  # the rounds evaluate on one grouping and cluster
    activations = activations * _kept_fraction(group_graph, cluster, persistent, activations, cost, granularity,
                                               cache)
    runs = _Runs(group_graph, cluster, members, sequence, persistent[sequence], activations[sequence])
    budget = INITIAL_BUDGET * capacity  # [M]
    for _ in range(max_rounds):
        cut = _cut(runs, budget)
        if cut is None:
            return None
        strategy = _strategy(cut, sequence, cluster, batch_split)
        result = evaluate_strategy(group_graph, strategy, cluster, cost=cost, granularity=granularity, feedback=False,
                                   cache=cache)
        if result.feasible:
            return strategy
        peak = np.array([result.peak_memory[d].max() for d in members])  # [M]
        over = peak > capacity
        budget[over] *= capacity[over] / peak[over] * 0.97
    return None


def _kept_fraction(group_graph: GroupGraph, cluster: Cluster, persistent: np.ndarray, activations: np.ndarray,
                   cost: CostModel | None, granularity: str, cache: CompilerCache) -> float:
    """The fraction of forward outputs that the simulator holds at its peak under data parallelism over
    every device (each device keeps 1/D of the batch's activations and all of the persistent state)."""
    if activations.sum() <= 0:
        return 1.0
    dp = Strategy.data_parallel(group_graph.num_groups, cluster, option=ALLREDUCE)
    result = evaluate_strategy(group_graph, dp, cluster, cost=cost, granularity=granularity, feedback=False,
                               cache=cache)
    held = (float(result.peak_memory.max()) - persistent.sum()) * cluster.num_devices
    return float(np.clip(held / activations.sum(), 0.05, 1.0))


class _Runs:
    """Run costs over the layer sequence for any set of device groups (a bitmask), cached per mask."""

    def __init__(self, group_graph: GroupGraph, cluster: Cluster, members: list[np.ndarray], sequence: np.ndarray,
                 persistent: np.ndarray, activations: np.ndarray) -> None:
        self.cluster = cluster
        self.members = members
        self.compute = group_graph.compute_table(cluster)[sequence]  # [G, T] in layer order
        self.prefix_params = _prefix(group_graph.param_bytes[sequence])  # [G+1]
        self.prefix_persistent = _prefix(persistent)  # [G+1]
        self.prefix_activations = _prefix(activations)  # [G+1]
        self._time: dict[int, np.ndarray] = {}

    def devices(self, mask: int) -> np.ndarray:
        return np.concatenate([self.members[m] for m in _bits(mask)])

    def time(self, mask: int) -> np.ndarray:
        """[G+1, G+1] seconds of positions i..j−1 as one run on the device groups of ``mask``: the batch split
        evenly over its k devices, the slowest paces; plus a ring all-reduce of the run's parameters at the
        slowest link among them. ∞ below the diagonal."""
        table = self._time.get(mask)
        if table is None:
            devices = self.devices(mask)
            k = len(devices)
            prefix = _prefix(self.compute[:, self.cluster.device_type[devices]].max(axis=1) / k)
            sync_per_byte = 0.0
            if k > 1:
                links = self.cluster.bandwidth[np.ix_(devices, devices)][~np.eye(k, dtype=bool)]
                sync_per_byte = 2.0 * (k - 1) / k / links.min()
            span = prefix[None, :] - prefix[:, None]
            params = self.prefix_params[None, :] - self.prefix_params[:, None]
            table = self._time[mask] = np.where(span >= 0, span + sync_per_byte * params, _INFEASIBLE)
        return table

    def cost(self, mask: int, budget: np.ndarray) -> np.ndarray:
        """[G+1, G+1] run time where every device of ``mask`` keeps within its device group's budget, else ∞;
        the empty run (i = j) costs 0."""
        k = sum(len(self.members[m]) for m in _bits(mask))
        memory = (self.prefix_persistent[None, :] - self.prefix_persistent[:, None]) \
            + (self.prefix_activations[None, :] - self.prefix_activations[:, None]) / k
        cost = np.where(memory <= min(budget[m] for m in _bits(mask)), self.time(mask), _INFEASIBLE)
        np.fill_diagonal(cost, 0.0)
        return cost


def _cut(runs: _Runs, budget: np.ndarray) -> list[tuple[int, int, int]] | None:
    """Contiguous runs (device-group mask, first position, end position) of the layer sequence on disjoint
    sets of device groups, minimising the summed run time under ``budget``; None when nothing fits.

    f[U, j] = least time placing positions 0..j−1 on the device groups U; f[U ∪ m, j'] = min over j of
    f[U, j] + cost(m, j, j') for every non-empty m disjoint from U (3^M pairs: M ≤ MAX_SUBSET_GROUPS).
    Beyond that, runs take one device group each, in a fixed fastest-first order."""
    num_device_groups = len(budget)
    size = runs.prefix_params.shape[0]  # G+1
    if num_device_groups > MAX_SUBSET_GROUPS:
        return _cut_chain(runs, budget)
    full = (1 << num_device_groups) - 1
    best = np.full((full + 1, size), _INFEASIBLE)  # [2^M, G+1]
    best[0, 0] = 0.0
    back: dict[tuple[int, int], tuple[int, int, int]] = {}  # (U', j') → (U, mask, j)
    for used in range(full):  # every subset of U ∪ m is numbered below it, so f[U] is final here
        if not np.isfinite(best[used]).any():
            continue
        free = full & ~used
        mask = free
        while mask:
            total = best[used][:, None] + runs.cost(mask, budget)  # [j, j']
            start = np.argmin(total, axis=0)  # [G+1]
            value = total[start, np.arange(size)]
            better = np.flatnonzero(value < best[used | mask])
            best[used | mask, better] = value[better]
            for end in better.tolist():
                back[(used | mask, end)] = (used, mask, int(start[end]))
            mask = (mask - 1) & free
    final = int(np.argmin(best[:, size - 1]))
    if not np.isfinite(best[final, size - 1]):
        return None
    out, state = [], (final, size - 1)
    while state != (0, 0):
        used, mask, first = back[state]
        if first < state[1]:
            out.append((mask, first, state[1]))
        state = (used, first)
    return out[::-1]


def _cut_chain(runs: _Runs, budget: np.ndarray) -> list[tuple[int, int, int]] | None:
    """One run per device group, device groups fastest first on the whole model, a run possibly empty."""
    size = runs.prefix_params.shape[0]
    order = sorted(range(len(budget)), key=lambda m: runs.time(1 << m)[0, -1])
    best = np.full(size, _INFEASIBLE)  # [G+1] least time placing positions 0..j−1 so far
    best[0] = 0.0
    choices = []  # per device group in order: [G+1] the start of its run for each end j
    for m in order:
        total = best[:, None] + runs.cost(1 << m, budget)  # [i, j]
        start = np.argmin(total, axis=0)
        best = total[start, np.arange(size)]
        choices.append((m, start))
    if not np.isfinite(best[-1]):
        return None
    out, end = [], size - 1
    for m, start in reversed(choices):
        first = int(start[end])
        if first < end:
            out.append((1 << m, first, end))
        end = first
    return out[::-1]


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


def _bits(mask: int) -> list[int]:
    return [m for m in range(mask.bit_length()) if mask >> m & 1]


def _strategy(runs: list[tuple[int, int, int]], sequence: np.ndarray, cluster: Cluster, batch_split: str
              ) -> Strategy:
    num_groups = len(sequence)
    placement = np.zeros((num_groups, cluster.num_device_groups), dtype=bool)  # [G, M]
    for mask, first, end in runs:
        placement[np.ix_(sequence[first:end], _bits(mask))] = True
    return Strategy.from_cluster(cluster, placement, np.full(num_groups, ALLREDUCE, dtype=np.int8),
                                 batch_split=batch_split)
