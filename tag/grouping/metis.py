"""METIS grouping of an op graph (TAG §4.1.1, §5.1) and METIS model-parallel splits of one group (§4.2).

:func:`group_ops` does, in order:

1. **Atoms** — ops that must stay together are contracted first (:func:`op_atoms`):

   - a parameter's optimizer update: the weakly connected components of the optimizer-role ops
     (traced Adam: the ``exp_avg`` and ``exp_avg_sq`` updates and the ``addcdiv`` of one parameter; a
     PipeDream profile: the one ``Adam`` op of a layer), together with the input-role ops all of whose
     consumers are in that component (the optimizer states ``exp_avg`` / ``exp_avg_sq``).
     The parameter itself is *not* put there: it is also read by the forward and backward ops, and a
     group holding both the parameter (a source) and its update (a sink after the weight gradient)
     lies on the cycle parameter → forward → … → gradient → update, unless it swallows the whole
     path. Like every other input op it joins its first consumer (the forward op reading the weight);
   - every other input-role op (the batch, buffers, constants) joins its first consumer in a
     topological order. Input ops cost nothing, and a source can join any one of its consumers
     without creating a cycle.

   Should an atom still sit on a cycle of the atom graph (a graph with unusual structure), its ops are
   left as single ops, with a warning.
2. **METIS** (``pymetis.part_graph``, k-way) over the atom graph made undirected: vertex weight = the
   atom's compute time (the mean op time over the given GPU types, by the cost model; at least one
   unit after scaling to integers), edge weight = bytes of the tensors between two atoms (parallel
   edges and both directions merged), ``num_groups`` parts, balance ``ufactor`` (the largest part may
   weigh 1 + ufactor/1000 times the mean; TAG's "balance factor of 2" is ufactor = 1000), seeded.
3. **Acyclic repair** — METIS parts of a training graph are almost never convex; see
   :mod:`tag.grouping.acyclic`: split each part by crossing rank, merge pieces back where allowed,
   then merge down to ``num_groups``. Empty parts vanish; group ids are 0..G-1 in a topological order.
4. **Refinement and choice** — the repaired METIS grouping and the naive one (a topological order
   of the atoms cut into ``num_groups`` runs of equal compute) are each refined by
   :func:`tag.grouping.acyclic.refine_acyclic` (greedy moves of atoms between groups that cut fewer
   bytes, keep the groups a DAG and keep each group under the balance limit
   max((1 + ufactor/1000) · mean group time, heaviest atom)); the one of least cut within 1.1 times
   the limit wins (``info["chosen"]``). The repair costs METIS much of its advantage on a training graph (an
   acyclic grouping must separate a layer's forward from its backward, except around the loss, so
   every saved activation between them is cut), and on small graphs the naive runs are sometimes the
   better start (VGG16 into 8 groups, a few seeds in 20); the choice makes the result never cut more
   than the refined naive grouping.

:func:`split_group` splits one group across the devices of a device group for TAG's model-parallel
option: METIS with target part weights ``tpwgts`` proportional to device speed; a topological-order
greedy split when the group is too small for METIS or METIS misses the targets badly.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import sys
from contextlib import contextmanager
from typing import Iterator, Sequence

import networkx as nx
import numpy as np
import pymetis
from networkx.utils import UnionFind

from tag._rng import as_rng
from tag.cluster.gpus import GPUType
from tag.cost.compute import CostModel
from tag.errors import GraphError
from tag.graph.opgraph import ROLE_INPUT, ROLE_OPTIMIZER, OpGraph
from tag.grouping.acyclic import (
    dag_order,
    edge_cut,
    quotient_is_dag,
    refine_acyclic,
    repair_acyclic,
    topological_chunks,
)
from tag.grouping.errors import GroupingError
from tag.grouping.group_graph import GpuSpec, GroupGraph, resolve_gpus

__all__ = [
    "group_ops",
    "split_group",
    "GroupSplitter",
    "op_atoms",
    "naive_groups",
    "DEFAULT_NUM_GROUPS",
    "DEFAULT_UFACTOR",
    "DEFAULT_SPLIT_UFACTOR",
]

log = logging.getLogger(__name__)

DEFAULT_NUM_GROUPS = 60  # TAG §4.1.1 / §5.1 (its public code used 40)
DEFAULT_UFACTOR = 1000  # TAG §4.1.1: "balance factor of 2", i.e. max part ≤ 2 × mean
DEFAULT_SPLIT_UFACTOR = 30  # METIS's own k-way default: pieces within 3 % of their device's share
# METIS computes in integers: weights are scaled so that each kind sums to about this much.
_METIS_WEIGHT_TOTAL = 2**30
# METIS overshoots its own balance bound a little when single atoms are heavy (VGG16's convolutions into 40
# groups: +5 %); a candidate grouping within this factor of the limit still counts as balanced.
_BALANCE_SLACK = 1.1
# A group with fewer ops than this per device is split greedily: METIS cannot honour tpwgts on it.
_MIN_OPS_PER_DEVICE = 4


# ---------------------------------------------------------------------------------------------- group_ops
def group_ops(graph: OpGraph, *, num_groups: int = DEFAULT_NUM_GROUPS, ufactor: int = DEFAULT_UFACTOR,
              cost: CostModel | None = None, gpus: GpuSpec = None, seed: int | np.random.Generator = 0
              ) -> GroupGraph:
    """Partition ``graph`` into at most ``num_groups`` op groups whose quotient is a DAG (module docstring).

    ``gpus``: a Cluster, a list of GPU types or catalogue names (default: V100-16GB); op weights are the
    mean op time over them, and the result's ``compute_time`` is [G, T] over them. Same ``seed``, same
    grouping.
    """
    _check_positive_int(num_groups, "num_groups")
    _check_positive_int(ufactor, "ufactor")
    if graph.num_ops == 0:
        raise GraphError("cannot group an empty graph")
    cost = cost if cost is not None else CostModel()
    types = resolve_gpus(gpus)
    op_time = cost.op_time_table(graph, list(types)).mean(axis=1)  # [N]
    atom = op_atoms(graph)  # [N]
    num_atoms = int(atom.max()) + 1
    atom_time = np.bincount(atom, weights=op_time, minlength=num_atoms)  # [K]
    src, dst = atom[graph.edge_src], atom[graph.edge_dst]
    cross = src != dst
    src, dst, edge_bytes = src[cross], dst[cross], graph.edge_bytes[cross]

    info = {"method": "metis", "num_groups": num_groups, "ufactor": ufactor,
            "seed": seed if isinstance(seed, (int, np.integer)) else None, "atoms": num_atoms}
    if num_atoms <= num_groups:  # every atom its own group: nothing to partition
        group = _renumber_by_first(np.arange(num_atoms), dag_order(num_atoms, src, dst))
        info.update(chosen="atoms", metis_cut_bytes=float(edge_bytes.sum()))
        return GroupGraph.from_assignment(graph, group[atom], gpus=types, cost=cost, info=info)

    part = metis_parts(num_atoms, src, dst, edge_bytes, atom_time, num_groups, ufactor=ufactor,
                        seed=_metis_seed(seed))
    repaired, stats = repair_acyclic(num_atoms, src, dst, edge_bytes, atom_time, part, max_groups=num_groups)
    chunks = topological_chunks(dag_order(num_atoms, src, dst), atom_time, num_groups)
    chosen, group, candidate_info = _refine_and_choose({"metis": repaired, "topological-chunks": chunks},
                                                       src, dst, edge_bytes, atom_time, ufactor=ufactor)
    info.update(
        chosen=chosen, metis_cut_bytes=float(edge_bytes[part[src] != part[dst]].sum()), metis_parts=stats.parts,
        pieces=stats.pieces, same_part_merges=stats.same_part_merges, extra_merges=stats.extra_merges,
        **candidate_info,
    )
    return GroupGraph.from_assignment(graph, group[atom], gpus=types, cost=cost, info=info)


def _refine_and_choose(candidates: dict[str, np.ndarray], src: np.ndarray, dst: np.ndarray, edge_bytes: np.ndarray,
                       weight: np.ndarray, *, ufactor: int) -> tuple[str, np.ndarray, dict]:
    """Refine each candidate grouping [K] of the atoms; return the name and groups of the one of least cut
    within the balance limit (if none is, the best balanced), and per-candidate figures for ``info``."""
    num_nodes = weight.size
    refined, cuts, heaviest, feasible, moves = {}, {}, {}, {}, {}
    for name, labels in candidates.items():
        group_time = np.bincount(labels, weights=weight)
        limit = max((1 + ufactor / 1000) * group_time.mean(), weight.max())
        labels, moves[name] = refine_acyclic(num_nodes, src, dst, edge_bytes, weight, labels,
                                             max_weight=max(limit, group_time.max()))
        refined[name] = labels
        cuts[name] = float(edge_bytes[labels[src] != labels[dst]].sum())
        heaviest[name] = float(np.bincount(labels, weights=weight).max())
        feasible[name] = heaviest[name] <= limit * _BALANCE_SLACK
    chosen = min(refined, key=lambda name: (not feasible[name], cuts[name] if feasible[name] else heaviest[name]))
    return chosen, refined[chosen], {"candidate_cut_bytes": cuts, "refine_moves": moves}


def naive_groups(graph: OpGraph, *, num_groups: int = DEFAULT_NUM_GROUPS, cost: CostModel | None = None,
                 gpus: GpuSpec = None) -> GroupGraph:
    """The baseline: a topological order of the ops cut into ``num_groups`` runs of equal compute time."""
    _check_positive_int(num_groups, "num_groups")
    if graph.num_ops == 0:
        raise GraphError("cannot group an empty graph")
    cost = cost if cost is not None else CostModel()
    types = resolve_gpus(gpus)
    op_time = cost.op_time_table(graph, list(types)).mean(axis=1)
    assignment = topological_chunks(graph.topological_order(), op_time, num_groups)
    return GroupGraph.from_assignment(graph, assignment, gpus=types, cost=cost,
                                      info={"method": "topological-chunks", "num_groups": num_groups})


# ---------------------------------------------------------------------------------------------- atoms
def op_atoms(graph: OpGraph) -> np.ndarray:
    """[N] atom id of each op: ops that must share a group (module docstring, step 1), ids 0..K-1 in
    the order of each atom's first op in a topological order. The atoms' quotient is a DAG."""
    n = graph.num_ops
    topo = graph.topological_order()
    position = np.empty(n, dtype=np.int64)
    position[topo] = np.arange(n)
    atoms = UnionFind(range(n))  # any representative will do: atoms are renumbered by their first op below
    optimizer = graph.role == ROLE_OPTIMIZER
    for k in np.flatnonzero(optimizer[graph.edge_src] & optimizer[graph.edge_dst]):
        atoms.union(int(graph.edge_src[k]), int(graph.edge_dst[k]))
    for op in np.flatnonzero(graph.role == ROLE_INPUT):
        consumers = graph.successors(op)
        if consumers.size == 0:
            continue
        roots = {atoms[int(c)] for c in consumers}
        if optimizer[consumers].all() and len(roots) == 1:
            atoms.union(int(op), int(consumers[0]))  # an optimizer state: only its update reads it
        else:
            atoms.union(int(op), int(consumers[np.argmin(position[consumers])]))
    root = np.array([atoms[i] for i in range(n)], dtype=np.int64)
    atom = _renumber_by_first(root, topo)
    if not quotient_is_dag(graph.edge_src, graph.edge_dst, atom):
        atom = _break_cyclic_atoms(graph, atom, topo)
    return atom


def _renumber_by_first(labels: np.ndarray, topo: np.ndarray) -> np.ndarray:
    """Labels renumbered 0..K-1 in the order their first member appears in ``topo``."""
    first = np.full(int(labels.max()) + 1, labels.size, dtype=np.int64)
    position = np.empty(labels.size, dtype=np.int64)
    position[topo] = np.arange(labels.size)
    np.minimum.at(first, labels, position)
    used = np.flatnonzero(first < labels.size)
    renumber = np.empty(first.size, dtype=np.int64)
    renumber[used[np.argsort(first[used], kind="stable")]] = np.arange(used.size)
    return renumber[labels]


def _break_cyclic_atoms(graph: OpGraph, atom: np.ndarray, topo: np.ndarray) -> np.ndarray:
    """Split every atom on a cycle of the atom graph back into single ops (refining keeps a DAG there)."""
    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(int(atom.max()) + 1))
    cross = atom[graph.edge_src] != atom[graph.edge_dst]
    quotient.add_edges_from(zip(atom[graph.edge_src[cross]].tolist(), atom[graph.edge_dst[cross]].tolist()))
    cyclic = np.zeros(int(atom.max()) + 1, dtype=bool)
    for component in nx.strongly_connected_components(quotient):
        if len(component) > 1:
            cyclic[list(component)] = True
    log.warning("%s: %d atoms of ops that should stay together lie on a cycle; their ops are left apart",
                graph.meta.get("model", "graph"), int(cyclic.sum()))
    labels = np.where(cyclic[atom], atom.max() + 1 + np.arange(atom.size), atom)
    return _renumber_by_first(labels, topo)


# ---------------------------------------------------------------------------------------------- METIS
def _metis_seed(seed: int | np.random.Generator | None) -> int:
    """METIS takes an int seed: an int passes through (validated), a Generator or None draws one."""
    rng = as_rng(seed)
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed)
    return int(rng.integers(2**31 - 1))


def _integer_weights(values: np.ndarray) -> np.ndarray:
    """Non-negative floats → positive int64 weights summing to about ``_METIS_WEIGHT_TOTAL``."""
    values = np.asarray(values, dtype=np.float64)
    total = values.sum()
    if total <= 0:
        return np.ones(values.size, dtype=np.int64)
    return np.maximum(1, np.rint(values * (_METIS_WEIGHT_TOTAL / total))).astype(np.int64)


def metis_parts(num_nodes: int, src: np.ndarray, dst: np.ndarray, edge_bytes: np.ndarray, weight: np.ndarray,
                num_parts: int, *, ufactor: int, seed: int, tpwgts: Sequence[float] | None = None) -> np.ndarray:
    """[K] METIS k-way part of each node of the graph made undirected (parallel edges merged).

    ``weight`` [K] node weights and ``edge_bytes`` [E] edge weights are scaled to integers; ``tpwgts``
    gives each part's target share of the total node weight (None: equal shares).
    """
    return _metis_run(_metis_graph(num_nodes, src, dst, edge_bytes, weight), num_parts, ufactor=ufactor, seed=seed,
                      tpwgts=tpwgts)


def _metis_graph(num_nodes: int, src: np.ndarray, dst: np.ndarray, edge_bytes: np.ndarray,
                 weight: np.ndarray) -> tuple:
    """What METIS is given of a graph, whatever the parts asked of it: (CSR adjacency of the graph made
    undirected, parallel edges merged; its edge weights; the node weights; a digest of the three), weights
    scaled to integers."""
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    keep = lo != hi
    pair, inverse = np.unique(lo[keep] * num_nodes + hi[keep], return_inverse=True)
    pair_bytes = np.bincount(inverse, weights=edge_bytes[keep], minlength=pair.size)
    a, b = pair // num_nodes, pair % num_nodes
    ends = np.concatenate([a, b])
    others = np.concatenate([b, a])
    order = np.lexsort((others, ends))
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(ends, minlength=num_nodes), out=xadj[1:])
    adjacent = others[order]
    eweights = _integer_weights(np.concatenate([pair_bytes, pair_bytes])[order])
    vweights = _integer_weights(weight)
    digest = hashlib.blake2b(np.array([xadj.size, adjacent.size], dtype=np.int64).tobytes(), digest_size=16)
    for array in (xadj, adjacent, eweights, vweights):
        digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return pymetis.CSRAdjacency(xadj, adjacent), eweights, vweights, digest.digest()


def _metis_run(metis_graph: tuple, num_parts: int, *, ufactor: int, seed: int, tpwgts: Sequence[float] | None,
               runs: dict | None = None) -> np.ndarray:
    """[K] METIS k-way part of each node of a :func:`_metis_graph`. METIS's parts are a function of its input
    alone (its seed included): ``runs`` (if given) keeps them by input, and a call with the input of one kept
    gets a copy of its parts without running METIS."""
    adjacency, eweights, vweights, digest = metis_graph
    key = (digest, int(num_parts), int(ufactor), int(seed), None if tpwgts is None else tuple(map(float, tpwgts)))
    part = None if runs is None else runs.get(key)
    if part is None:
        options = pymetis.Options(seed=int(seed), ufactor=int(ufactor))
        with _quiet_c_stdout():
            _, found = pymetis.part_graph(num_parts, adjacency, vweights=vweights, eweights=eweights,
                                          tpwgts=None if tpwgts is None else list(tpwgts), recursive=False,
                                          options=options)
        part = np.asarray(found, dtype=np.int64)
        if runs is None:
            return part
        runs[key] = part
    return part.copy()


@contextmanager
def _quiet_c_stdout() -> Iterator[None]:
    """Silence METIS's C-level printf while it runs.

    When a vertex outweighs a part's target (one heavy layer among 40 parts), METIS's initial
    bisection prints "***Cannot bisect a graph with 0 vertices!" / "too many parts" to the C stdout
    and carries on with some parts empty, which grouping handles (empty parts are dropped). The text
    would reach the user's terminal through no logger, so fd 1 is pointed at /dev/null meanwhile.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no real stdout (e.g. replaced by an io object)
        yield
        return
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):  # no C library to flush (not a POSIX system): leave the output alone
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


# ---------------------------------------------------------------------------------------------- split_group
def split_group(graph: OpGraph, group_ops: Sequence[int] | np.ndarray, device_speeds: Sequence[float] | np.ndarray,
                *, cost: CostModel | None = None, gpu: GPUType | str | None = None,
                ufactor: int = DEFAULT_SPLIT_UFACTOR, convex: bool = False,
                seed: int | np.random.Generator = 0) -> np.ndarray:
    """[len(group_ops)] device index (into ``device_speeds``) of each op of a group, for model parallelism.

    METIS over the group's ops (weights: op times on ``gpu``, default V100-16GB; edges: tensor bytes)
    with target part weights ``tpwgts`` ∝ ``device_speeds``, and a greedy split (:func:`_greedy_split`:
    runs of a topological order of the group, sized ∝ speed). The greedy split alone is used when the
    group has fewer than ``_MIN_OPS_PER_DEVICE`` ops per device (METIS leaves parts empty there);
    otherwise the candidate of least cut among those whose slowest device (load / speed) is within
    1 + ufactor/1000 of the better one's, METIS's own objective.

    Convexity is not required by default: op-level tasks of a model-parallel group naturally go back
    and forth between devices (layer i's forward and backward on one device, layer i+1's on another:
    device 0 → 1 for activations, 1 → 0 for gradients), and a convex split would forbid exactly that.
    ``convex=True`` (for a simulator that runs each device's piece as one task) makes the device pieces
    form a DAG: METIS's split repaired by :func:`tag.grouping.acyclic.repair_acyclic` into at most D
    pieces, matched heaviest piece to fastest device, or the greedy split (always convex) if better
    balanced by more than the tolerance.
    """
    return GroupSplitter(graph, group_ops, cost=cost, gpu=gpu).split(device_speeds, ufactor=ufactor, convex=convex,
                                                                     seed=seed)


class GroupSplitter:
    """:func:`split_group` for one group on one GPU type, over any device speeds: what does not depend on the
    devices (the ops' weights, the edges inside the group, a topological order, METIS's graph) is computed
    once, on first use, so that a search splitting a group over many device sets pays for it once. Splitters
    given one ``runs`` dict share METIS's runs: equal input (groups of repeated layers over the same device
    speeds) runs METIS once (:func:`_metis_run`)."""

    def __init__(self, graph: OpGraph, group_ops: Sequence[int] | np.ndarray, *, cost: CostModel | None = None,
                 gpu: GPUType | str | None = None, op_times: np.ndarray | None = None, runs: dict | None = None):
        ops = np.asarray(group_ops, dtype=np.int64).reshape(-1)
        if ops.size == 0:
            raise GroupingError("split_group: the group has no ops")
        if ops.min() < 0 or ops.max() >= graph.num_ops:
            raise GroupingError(f"split_group: op ids must be in 0..{graph.num_ops - 1}")
        if np.unique(ops).size != ops.size:
            raise GroupingError("split_group: repeated op ids in the group")
        self.graph, self.ops, self._cost, self._gpu = graph, ops, cost, gpu
        # [N] every op's seconds on the GPU, ``cost.op_times(graph, gpu)``: given by a caller that splits many
        # groups of one graph (it then stands for ``cost`` and ``gpu``), or computed on first use
        if op_times is not None and np.shape(op_times) != (graph.num_ops,):
            raise GroupingError(f"split_group: op_times must have one entry per op ({graph.num_ops}), "
                                f"got shape {np.shape(op_times)}")
        self._op_times = op_times
        self._setup: tuple | None = None  # (weight [n], src [e], dst [e], edge_bytes [e], order [n])
        self._metis: tuple | None = None  # _metis_graph of the group
        self._runs = runs

    def _prepared(self) -> tuple:
        if self._setup is None:
            graph, ops = self.graph, self.ops
            op_times = self._op_times
            if op_times is None:
                cost = self._cost if self._cost is not None else CostModel()
                op_times = cost.op_times(graph, resolve_gpus(self._gpu)[0])
            weight = op_times[ops]  # [n]
            if weight.sum() <= 0:
                weight = np.ones(ops.size)
            local = np.full(graph.num_ops, -1, dtype=np.int64)
            local[ops] = np.arange(ops.size)
            inside = (local[graph.edge_src] >= 0) & (local[graph.edge_dst] >= 0)
            src, dst = local[graph.edge_src[inside]], local[graph.edge_dst[inside]]
            self._setup = (weight, src, dst, graph.edge_bytes[inside], dag_order(ops.size, src, dst))
        return self._setup

    def split(self, device_speeds: Sequence[float] | np.ndarray, *, ufactor: int = DEFAULT_SPLIT_UFACTOR,
              convex: bool = False, seed: int | np.random.Generator = 0) -> np.ndarray:
        """[ops] device index (into ``device_speeds``) of each op of the group (:func:`split_group`)."""
        ops = self.ops
        speeds = np.asarray(device_speeds, dtype=np.float64).reshape(-1)
        _check_positive_int(ufactor, "ufactor")
        if speeds.size == 0 or not np.isfinite(speeds).all() or (speeds <= 0).any():
            raise GroupingError(f"split_group: device speeds must be positive and finite, got {speeds.tolist()}")
        if speeds.size == 1:
            return np.zeros(ops.size, dtype=np.int64)
        weight, src, dst, edge_bytes, order = self._prepared()
        greedy = _greedy_split(order, weight, speeds)
        if ops.size < _MIN_OPS_PER_DEVICE * speeds.size:
            log.debug("split_group: %d ops for %d devices; greedy split", ops.size, speeds.size)
            return greedy
        if self._metis is None:
            self._metis = _metis_graph(ops.size, src, dst, edge_bytes, weight)
        device = _metis_run(self._metis, speeds.size, ufactor=ufactor, seed=_metis_seed(seed),
                            tpwgts=speeds / speeds.sum(), runs=self._runs)
        if convex and not quotient_is_dag(src, dst, device):
            piece, _ = repair_acyclic(ops.size, src, dst, edge_bytes, weight, device, max_groups=speeds.size)
            piece_weight = np.bincount(piece, weights=weight)
            device_of_piece = np.empty(piece_weight.size, dtype=np.int64)
            fastest_first = np.argsort(-speeds, kind="stable")
            device_of_piece[np.argsort(-piece_weight, kind="stable")] = fastest_first[: piece_weight.size]
            device = device_of_piece[piece]
        # METIS's objective, applied to the two candidates: least cut among those balanced within the tolerance.
        candidates = (device, greedy)
        makespan = np.array([_makespan(c, weight, speeds) for c in candidates])
        cut = np.array([edge_cut(src, dst, edge_bytes, c) for c in candidates])
        feasible = makespan <= (1 + ufactor / 1000) * makespan.min()
        choice = int(np.lexsort((makespan, np.where(feasible, cut, np.inf)))[0])
        if choice == 1:
            log.debug("split_group: the greedy split of a %d-op group beats METIS's", ops.size)
        return candidates[choice]


def _greedy_split(order: np.ndarray, weight: np.ndarray, speeds: np.ndarray) -> np.ndarray:
    """[n] device of each op: a topological ``order`` cut into D runs with weight ∝ speed, device 0 first.

    An op goes to the device whose share its weight midpoint falls in (so runs are convex)."""
    w = weight[order]
    midpoint = (np.cumsum(w) - w / 2) / w.sum()
    bounds = np.cumsum(speeds / speeds.sum())[:-1]
    device = np.empty(order.size, dtype=np.int64)
    device[order] = np.searchsorted(bounds, midpoint, side="right")
    return device


def _makespan(device: np.ndarray, weight: np.ndarray, speeds: np.ndarray) -> float:
    """The slowest device's load / speed."""
    return float((np.bincount(device, weights=weight, minlength=speeds.size) / speeds).max())


def _check_positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise GroupingError(f"{name} must be a positive integer, got {value!r}")
