"""How fast any plan could be: the compute bound of one training iteration on a cluster.

Every plan runs each op of an iteration on its whole batch somewhere (split, replicated or pipelined: a
share f of an op costs ``fixed + f · scaled`` ≥ f · (fixed + scaled), so splitting never saves work), and
a device runs one op at a time. With w[o, t] the seconds of op o on the whole batch on GPU type t and
n[t] devices of type t, no plan finishes before the optimum of the fractional load-balancing LP

    T* = min T   s.t.   Σ_o x[o, t] · w[o, t] ≤ n[t] · T,   Σ_t x[o, t] = 1,   x ≥ 0,

the work of one iteration spread over the summed speed of the devices, each op on the types where it is
cheapest. Its dual says T* = max over λ ≥ 0 with Σ_t n[t] λ[t] = 1 of Σ_o min_t λ[t] w[o, t]: every
feasible λ gives a lower bound (weak duality), so :func:`compute_bound` searches λ (exactly for one or
two GPU types, by a refined grid beyond) and what it returns is a bound whatever the search finds. With
one GPU type it is Σ_o w[o] / D; when every op's times are proportional across types, the batch's work
over the summed speed of all devices.
"""

from __future__ import annotations

import itertools

import numpy as np

from tag.cluster import Cluster
from tag.cost import CostModel
from tag.graph.opgraph import OpGraph

__all__ = ["compute_bound", "dual_bound"]


def dual_bound(work: np.ndarray, counts: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """[L] the dual objective at each of L points: ``work`` [O, K] seconds of each op on each GPU type,
    ``counts`` [K] devices of each type, ``shares`` [L, K] points p of the simplex (λ[t] = p[t] / n[t])."""
    lam = shares / counts[None, :]  # [L, K]
    return (work[None, :, :] * lam[:, None, :]).min(axis=2).sum(axis=1)


def _simplex_grid(k: int, steps: int) -> np.ndarray:
    """[L, k] points of the k-simplex with coordinates in multiples of 1 / steps."""
    points = [c for c in itertools.product(range(steps + 1), repeat=k - 1) if sum(c) <= steps]
    grid = np.array([[*c, steps - sum(c)] for c in points], dtype=np.float64)
    return grid / steps


def _best_share(work: np.ndarray, counts: np.ndarray, *, rounds: int = 30) -> float:
    """The largest dual objective found: a grid over the simplex, then a shrinking grid around the best
    point (the objective is concave, so this converges on the optimum for few types)."""
    k = counts.size
    steps = {2: 64, 3: 24}.get(k, 6)
    grid = _simplex_grid(k, steps)
    values = dual_bound(work, counts, grid)
    best, value = grid[int(np.argmax(values))], float(values.max())
    radius = 1.0 / steps
    offsets = _simplex_grid(k, 4) - 1.0 / k  # [L', k] directions that keep the sum at 1
    for _ in range(rounds):
        trial = best[None, :] + radius * offsets
        trial = trial[(trial >= 0).all(axis=1)]
        values = dual_bound(work, counts, trial)
        if values.max() > value:
            best, value = trial[int(np.argmax(values))], float(values.max())
        else:
            radius /= 2
    return value


def compute_bound(graph: OpGraph, cluster: Cluster, *, cost: CostModel | None = None) -> float:
    """Seconds: no plan of ``graph`` on ``cluster`` runs an iteration faster (module docstring)."""
    cost = cost if cost is not None else CostModel()
    counts = np.bincount(cluster.device_type, minlength=len(cluster.types)).astype(np.float64)
    used = np.flatnonzero(counts > 0)
    work = np.stack([cost.op_times(graph, cluster.types[t]) for t in used], axis=1)  # [O, K]
    counts = counts[used]
    if used.size == 1:
        return float(work.sum() / counts[0])
    return _best_share(work, counts)
