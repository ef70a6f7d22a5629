"""The sufficient-factor-broadcasting integer program of one gradient (TAG §4.2.3).

Symbols of TAG Table 2. V candidate ops around one gradient op g (the ``root``), E tensors read by them,
D replicas, bottleneck bandwidth τ:

    min   (D−1) Σ_{i∈V} αᵢ Tᵢ  +  D(D−1) Σ_{(j,i)∈E} b_ji L_ji / τ  −  α_g · S        (TAG §4.2.3)
    s.t.  α_k ≤ Σ_{(k,i)∈E} αᵢ     ∀ k ∈ V ∖ {g}
          b_ji ≥ αᵢ − α_j          ∀ (j,i) ∈ E
          αᵢ, b_ji ∈ {0, 1}

with S = 2 (D−1)/D · L_gl / τ, the ring all-reduce of the gradient that SFB makes unnecessary (the
paper's third term). A caller may give another S ("the case of other AllReduce algorithms and PS can be
formulated accordingly": a parameter server on one replica takes 2 (D−1) L_gl / τ). αᵢ = 1 duplicates op
i (every replica runs it on the whole batch); b_ji = 1 broadcasts tensor (j, i) to every replica. The
objective is the extra time of applying SFB; its negation, when positive, is the time saved.

Conventions that keep the arrays self-contained:

- The paper's V also holds the optimizer op l, exempt from the first constraint (k ∈ V ∖ {l}). Here l
  stays outside V: it runs on every replica with or without SFB, costs no extra time and reads only
  whole tensors besides the gradient (the parameter, its optimizer states), so keeping it would only add
  α_g ≤ α_l, which α_l = 1 satisfies for free. The root g is exempt instead.
- A tensor whose producer is outside V (never duplicated, α_j = 0) has ``edge_src == EXTERNAL``.
- Tᵢ is the time of one more copy of op i: the caller chooses it so that (D−1)·Tᵢ is the extra compute
  on the slowest replica (:mod:`tag.sfb.plan`), the paper's Tᵢ when op time is linear in the batch.
- L_ji is the size of the piece of tensor (j, i) one replica holds: each of the D(D−1) transfers of the
  second term carries one replica's piece to one other replica. Fig. 4: D = 2, L = B·H₁ and B·H₂ give
  2(H₂·B + B·H₁) broadcast instead of an all-reduce of H₂·H₁.

Solvers: exhaustive enumeration of α over small V (vectorised; also the reference the tests check CBC
against), else CBC through pulp with a time limit. When CBC stops at its time limit pulp still reports
``LpStatus`` "Optimal"; the solution status (``sol_status``) tells a proven optimum from an incumbent,
so a timed-out solve is reported as such and its incumbent is kept only if it beats the cut that
duplicates g alone (Fig. 4's cut A). Solutions are cached by (problem signature, D, τ).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tag.sfb.errors import SFBError

__all__ = [
    "EXTERNAL",
    "SFBDecision",
    "SFBCache",
    "solve_sfb",
    "sfb_objective",
    "problem_signature",
    "METHODS",
    "STATUSES",
    "OPTIMAL",
    "EXHAUSTIVE",
    "BOUND",
    "TIME_LIMIT",
    "NO_SOLUTION",
    "DEFAULT_TIME_LIMIT_S",
    "AUTO_EXHAUSTIVE_OPS",
    "MAX_EXHAUSTIVE_OPS",
]

EXTERNAL = -1  # edge_src of a tensor produced outside V

METHODS = ("auto", "cbc", "exhaustive")
# How a decision was reached. Proven optimal: OPTIMAL (CBC), EXHAUSTIVE (enumeration), BOUND (no solve:
# one copy of g already costs more than the sync it saves). Not proven: TIME_LIMIT (CBC's incumbent at its
# time limit, or cut A if better), NO_SOLUTION (CBC found nothing in time: cut A or no change).
STATUSES = ("optimal", "exhaustive", "bound", "time_limit", "no_solution")
OPTIMAL, EXHAUSTIVE, BOUND, TIME_LIMIT, NO_SOLUTION = STATUSES
_PROVEN = (OPTIMAL, EXHAUSTIVE, BOUND)

DEFAULT_TIME_LIMIT_S = 1.0  # TAG §5.1: CBC "reliably" solves it "within hundreds of milliseconds"
AUTO_EXHAUSTIVE_OPS = 10  # "auto" enumerates 2^|V| assignments up to this size (faster than starting CBC)
MAX_EXHAUSTIVE_OPS = 16  # "exhaustive" refuses larger V (2^16 assignments × E tensors stay a few MB)
_TOLERANCE = 1e-9  # relative to the objective's scale: smaller differences are ties


class SFBDecision(NamedTuple):
    """The solution of one SFB program. V ops, E tensors. Arrays are read-only (decisions are shared by
    the cache)."""

    duplicated: np.ndarray  # [V] bool, α: ops every replica runs on the whole batch
    broadcast: np.ndarray  # [E] bool, b: tensors broadcast to every replica (L > 0 and the cut crosses them)
    time_saved: float  # seconds, −objective ≥ 0; 0 when nothing changes
    extra_compute: float  # seconds, (D−1) Σ αᵢ Tᵢ
    broadcast_time: float  # seconds, D(D−1) Σ b_ji L_ji / τ
    sync_saved: float  # seconds, α_g · S
    status: str  # one of STATUSES
    method: str  # "cbc", "exhaustive" or "bound": what produced it

    @property
    def changed(self) -> bool:
        """SFB applies: g is duplicated and its synchronisation dropped."""
        return bool(self.duplicated.any())

    @property
    def optimal(self) -> bool:
        """Proven optimal (not a time-limited incumbent or a fallback)."""
        return self.status in _PROVEN

    def as_dict(self) -> dict[str, Any]:
        return {"duplicated": np.flatnonzero(self.duplicated).tolist(),
                "broadcast": np.flatnonzero(self.broadcast).tolist(), "time_saved_s": self.time_saved,
                "extra_compute_s": self.extra_compute, "broadcast_time_s": self.broadcast_time,
                "sync_saved_s": self.sync_saved, "status": self.status, "method": self.method}


@dataclass(eq=False)
class SFBCache:
    """Decisions keyed by (problem signature, D, τ) (:func:`problem_signature`); emptied when full. Also
    each grouping's memo (:meth:`graph_memo`): its SFB tables and per-group results, for at most
    ``max_graphs`` groupings at a time (each held by reference, so that its id cannot be reused)."""

    max_entries: int = 100_000
    max_graphs: int = 8
    entries: dict = field(default_factory=dict)
    graphs: dict = field(default_factory=dict)  # id(grouping) -> (grouping, its memo)
    hits: int = 0
    misses: int = 0

    def get(self, key: tuple) -> SFBDecision | None:
        decision = self.entries.get(key)
        if decision is None:
            self.misses += 1
        else:
            self.hits += 1
        return decision

    def put(self, key: tuple, decision: SFBDecision) -> None:
        if len(self.entries) >= self.max_entries:
            self.entries.clear()
        self.entries[key] = decision

    def __len__(self) -> int:
        return len(self.entries)

    def graph_memo(self, group_graph: Any) -> dict:
        """The memo of ``group_graph`` (created empty on the first request)."""
        entry = self.graphs.get(id(group_graph))
        if entry is None or entry[0] is not group_graph:
            if len(self.graphs) >= self.max_graphs:
                self.graphs.clear()
            entry = self.graphs[id(group_graph)] = (group_graph, {})
        return entry[1]


class _Problem(NamedTuple):
    """Validated inputs of one program (module docstring). V ops, E edges."""

    op_time: np.ndarray  # [V] float64 Tᵢ, seconds
    edge_src: np.ndarray  # [E] int64 op in V or EXTERNAL
    edge_dst: np.ndarray  # [E] int64 op in V
    edge_bytes: np.ndarray  # [E] float64 L_ji
    gradient_bytes: float  # L_gl
    num_replicas: int  # D
    bandwidth: float  # τ, bytes/s
    root: int  # g
    sync_time: float  # S, seconds

    @property
    def scale(self) -> float:
        """The largest magnitude the objective can reach: ties are judged relative to it."""
        d = self.num_replicas
        return (self.sync_time + (d - 1) * float(self.op_time.sum())
                + d * (d - 1) * float(self.edge_bytes.sum()) / self.bandwidth) or 1.0


# ------------------------------------------------------------------------------------------------ entry


def solve_sfb(op_time: Any, edge_src: Any, edge_dst: Any, edge_bytes: Any, gradient_bytes: float,
              num_replicas: int, bandwidth: float, *, root: int = 0, sync_time: float | None = None,
              method: str = "auto", time_limit: float = DEFAULT_TIME_LIMIT_S, cache: SFBCache | None = None,
              solver: Any = None) -> SFBDecision:
    """Solve the SFB program of one gradient (module docstring) and return its :class:`SFBDecision`.

    ``op_time`` [V] Tᵢ seconds; ``edge_src`` [E] producer (index into V, or :data:`EXTERNAL`),
    ``edge_dst`` [E] consumer (index into V), ``edge_bytes`` [E] L_ji; ``gradient_bytes`` L_gl;
    ``num_replicas`` D ≥ 2; ``bandwidth`` τ bytes/s; ``root`` the index of g in V; ``sync_time`` S
    (default the ring all-reduce 2(D−1)/D · L_gl/τ). ``method``: ``"cbc"``, ``"exhaustive"`` (|V| ≤
    :data:`MAX_EXHAUSTIVE_OPS`) or ``"auto"`` (exhaustive up to :data:`AUTO_EXHAUSTIVE_OPS` ops).
    ``time_limit``: CBC's, in seconds. ``solver``: a pulp solver to run instead of CBC with that limit.
    ``cache``: reuse and store proven-optimal decisions by (signature, D, τ). SFBError names a malformed
    argument.
    """
    if method not in METHODS:
        raise SFBError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    if not _positive(time_limit):
        raise SFBError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    problem = _check_problem(op_time, edge_src, edge_dst, edge_bytes, gradient_bytes, num_replicas, bandwidth,
                             root, sync_time)
    key = (problem_signature(problem), problem.num_replicas, problem.bandwidth)
    if cache is not None:
        cached = cache.get(key)
        if cached is not None:
            return cached
    decision = _solve(problem, method, time_limit, solver)
    if cache is not None and decision.optimal:  # a time-limited incumbent must not answer a later, longer call
        cache.put(key, decision)
    return decision


def sfb_objective(alpha: Any, op_time: Any, edge_src: Any, edge_dst: Any, edge_bytes: Any, gradient_bytes: float,
                  num_replicas: int, bandwidth: float, *, root: int = 0, sync_time: float | None = None) -> float:
    """The objective of the assignment ``alpha`` [V] (bool) for the program :func:`solve_sfb` takes, with
    the least cut it allows (b_ji = 1 where αᵢ > α_j and L_ji > 0). Feasibility is not checked."""
    problem = _check_problem(op_time, edge_src, edge_dst, edge_bytes, gradient_bytes, num_replicas, bandwidth,
                             root, sync_time)
    alpha = np.asarray(alpha, dtype=bool).reshape(1, -1)
    if alpha.shape[1] != problem.op_time.size:
        raise SFBError(f"alpha has {alpha.shape[1]} entries for {problem.op_time.size} ops")
    return float(_terms(alpha, problem)[0][0])


def problem_signature(problem: _Problem) -> str:
    """A digest of everything but D and τ that the decision depends on (the cache key adds D and τ)."""
    digest = hashlib.blake2b(digest_size=16)
    for array in (problem.op_time, problem.edge_src, problem.edge_dst, problem.edge_bytes):
        digest.update(np.ascontiguousarray(array).tobytes())
        digest.update(b"|")
    digest.update(np.array([problem.gradient_bytes, problem.sync_time, problem.root], dtype=np.float64).tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ solve


def _solve(problem: _Problem, method: str, time_limit: float, solver: Any) -> SFBDecision:
    d, root = problem.num_replicas, problem.root
    tolerance = _TOLERANCE * problem.scale
    # Every solution that duplicates anything duplicates g (the first constraint, followed down to g), so
    # one extra copy of g alone already costs more than the sync it could save: nothing to solve.
    if problem.sync_time <= (d - 1) * problem.op_time[root] + tolerance:
        return _decision(np.zeros(problem.op_time.size, dtype=bool), problem, BOUND, "bound")
    if method == "exhaustive" or (method == "auto" and problem.op_time.size <= AUTO_EXHAUSTIVE_OPS):
        return _exhaustive(problem)
    return _solve_cbc(problem, time_limit, solver)


def _terms(alpha: np.ndarray, problem: _Problem) -> tuple[np.ndarray, ...]:
    """Objective terms of K assignments ``alpha`` [K, V] bool: (objective, extra compute, broadcast time,
    sync saved) [K] each, and the least cut b [K, E] bool."""
    d = problem.num_replicas
    src, dst = problem.edge_src, problem.edge_dst
    src_duplicated = np.where(src >= 0, alpha[:, np.maximum(src, 0)], False)  # [K, E]
    cut = alpha[:, dst] & ~src_duplicated & (problem.edge_bytes > 0)  # [K, E]
    extra = (d - 1) * (alpha @ problem.op_time)
    broadcast = d * (d - 1) * (cut @ problem.edge_bytes) / problem.bandwidth
    saved = alpha[:, problem.root] * problem.sync_time
    return extra + broadcast - saved, extra, broadcast, saved, cut


def _feasible(alpha: np.ndarray, problem: _Problem) -> np.ndarray:
    """[K] bool: α_k ≤ Σ of its consumers' α for every k but g."""
    v = problem.op_time.size
    inside = problem.edge_src >= 0
    src, dst = problem.edge_src[inside], problem.edge_dst[inside]
    incidence = np.zeros((src.size, v), dtype=np.int64)  # [E_in, V] producer of each internal edge
    incidence[np.arange(src.size), src] = 1
    consumers = alpha[:, dst].astype(np.int64) @ incidence  # [K, V] duplicated consumers of each op
    violated = alpha & (consumers == 0)
    violated[:, problem.root] = False
    return ~violated.any(axis=1)


def _decision(alpha: np.ndarray, problem: _Problem, status: str, method: str) -> SFBDecision:
    """The decision for one assignment ``alpha`` [V]; no change unless it saves time."""
    objective, extra, broadcast, saved, cut = _terms(alpha.reshape(1, -1), problem)
    if objective[0] >= -_TOLERANCE * problem.scale:
        alpha = np.zeros_like(alpha)
        objective, extra, broadcast, saved, cut = _terms(alpha.reshape(1, -1), problem)
    alpha = alpha.astype(bool).copy()
    cut = cut[0].copy()
    alpha.setflags(write=False)
    cut.setflags(write=False)
    return SFBDecision(alpha, cut, max(0.0, -float(objective[0])), float(extra[0]), float(broadcast[0]),
                       float(saved[0]), status, method)


def _best(alpha: np.ndarray, problem: _Problem) -> np.ndarray:
    """The assignment of least objective among ``alpha`` [K, V]; ties to the fewest duplicated ops."""
    objective = _terms(alpha, problem)[0]
    near = objective <= objective.min() + _TOLERANCE * problem.scale
    count = np.where(near, alpha.sum(axis=1), np.iinfo(np.int64).max)
    return alpha[int(np.argmin(count))]


def _exhaustive(problem: _Problem) -> SFBDecision:
    v = problem.op_time.size
    if v > MAX_EXHAUSTIVE_OPS:
        raise SFBError(f"exhaustive search takes at most {MAX_EXHAUSTIVE_OPS} ops, got {v}; use method='cbc'")
    codes = np.arange(1 << v, dtype=np.int64)
    alpha = ((codes[:, None] >> np.arange(v)) & 1).astype(bool)  # [2^V, V], row 0 all zero
    alpha = alpha[_feasible(alpha, problem)]
    return _decision(_best(alpha, problem), problem, EXHAUSTIVE, "exhaustive")


def _cbc(time_limit: float) -> Any:
    """CBC with ``time_limit``: a CBC on the PATH (pulp's COIN_CMD) if there is one, else the one bundled with
    pulp (PULP_CBC_CMD, which pulp 3.3 marks as going away in 4.0)."""
    import pulp

    installed = pulp.COIN_CMD(msg=False, timeLimit=time_limit)
    if installed.available():
        return installed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit)


def _solve_cbc(problem: _Problem, time_limit: float, solver: Any) -> SFBDecision:
    import pulp

    v, d = problem.op_time.size, problem.num_replicas
    scale = problem.scale  # coefficients of order 1 for CBC's tolerances
    model = pulp.LpProblem("sfb", pulp.LpMinimize)
    binary = getattr(model, "add_variable", None) or pulp.LpVariable  # pulp ≥ 3.3 owns variables by the model
    alpha = [binary(f"a{i}", cat=pulp.LpBinary) for i in range(v)]
    costly = np.flatnonzero(problem.edge_bytes > 0)
    cut = {int(e): binary(f"b{e}", cat=pulp.LpBinary) for e in costly}
    weight = d * (d - 1) * problem.edge_bytes / problem.bandwidth / scale
    model += (pulp.lpSum(float((d - 1) * problem.op_time[i] / scale) * alpha[i] for i in range(v))
              + pulp.lpSum(float(weight[e]) * b for e, b in cut.items())
              - float(problem.sync_time / scale) * alpha[problem.root])
    consumers: list[list[int]] = [[] for _ in range(v)]
    for j, i in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        if j >= 0:
            consumers[j].append(i)
    for k in range(v):
        if k != problem.root:
            model += alpha[k] <= pulp.lpSum(alpha[i] for i in consumers[k]), f"consumer{k}"
    for e, b in cut.items():
        j, i = int(problem.edge_src[e]), int(problem.edge_dst[e])
        model += (b >= alpha[i] - alpha[j]) if j >= 0 else (b >= alpha[i]), f"cut{e}"
    model.solve(solver if solver is not None else _cbc(time_limit))
    # LpStatus says "Optimal" for a time-limited incumbent too (module docstring): read sol_status.
    values = [a.varValue for a in alpha]
    found = model.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible) \
        and all(x is not None for x in values)
    incumbent = np.array([x > 0.5 for x in values], dtype=bool) if found else None
    if found and model.sol_status == pulp.LpSolutionOptimal:
        return _decision(incumbent, problem, OPTIMAL, "cbc")
    # Not proven: keep the better of the incumbent, cut A (g alone) and no change.
    cut_a = np.zeros(v, dtype=bool)
    cut_a[problem.root] = True
    options = [np.zeros(v, dtype=bool), cut_a]
    if found and _feasible(incumbent[None], problem)[0]:
        options.append(incumbent)
    status = TIME_LIMIT if found else NO_SOLUTION
    return _decision(_best(np.array(options), problem), problem, status, "cbc")


# ------------------------------------------------------------------------------------------------ checks


def _check_problem(op_time: Any, edge_src: Any, edge_dst: Any, edge_bytes: Any, gradient_bytes: float,
                   num_replicas: int, bandwidth: float, root: int = 0, sync_time: float | None = None) -> _Problem:
    times = _vector(op_time, "op_time", np.float64)
    v = times.size
    if v == 0:
        raise SFBError("op_time is empty: the program needs at least the gradient op")
    bad = ~(np.isfinite(times) & (times >= 0))
    if bad.any():
        raise SFBError(f"op_time must hold finite non-negative seconds, got {times[bad][0]!r}")
    src = _vector(edge_src, "edge_src", np.int64)
    dst = _vector(edge_dst, "edge_dst", np.int64)
    sizes = _vector(edge_bytes, "edge_bytes", np.float64)
    if not src.size == dst.size == sizes.size:
        raise SFBError(f"edge_src, edge_dst and edge_bytes must have one length, got {src.size}, {dst.size}, "
                       f"{sizes.size}")
    bad = (src < EXTERNAL) | (src >= v)
    if bad.any():
        raise SFBError(f"edge_src must be an op index in 0..{v - 1} or EXTERNAL ({EXTERNAL}), got {int(src[bad][0])}")
    if ((dst < 0) | (dst >= v)).any():
        raise SFBError(f"edge_dst must be an op index in 0..{v - 1}, got {int(dst[(dst < 0) | (dst >= v)][0])}")
    if (src == dst).any():
        raise SFBError(f"edge {int(np.argmax(src == dst))} goes from op {int(src[src == dst][0])} to itself")
    if not np.isfinite(sizes).all() or (sizes < 0).any():
        raise SFBError("edge_bytes must hold finite non-negative sizes")
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, (int, np.integer)) or num_replicas < 2:
        raise SFBError(f"num_replicas (D) must be an integer ≥ 2, got {num_replicas!r}")
    if not _positive(bandwidth):
        raise SFBError(f"bandwidth (τ) must be a positive finite number of bytes/s, got {bandwidth!r}")
    if not _non_negative(gradient_bytes):
        raise SFBError(f"gradient_bytes (L_gl) must be a finite non-negative size, got {gradient_bytes!r}")
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < v:
        raise SFBError(f"root must be an op index in 0..{v - 1}, got {root!r}")
    d, tau = int(num_replicas), float(bandwidth)
    if sync_time is None:
        sync_time = 2.0 * (d - 1) / d * float(gradient_bytes) / tau  # ring all-reduce, TAG §4.2.3
    elif not _non_negative(sync_time):
        raise SFBError(f"sync_time (S) must be finite non-negative seconds, got {sync_time!r}")
    return _Problem(times, src, dst, sizes, float(gradient_bytes), d, tau, int(root), float(sync_time))


def _vector(values: Any, name: str, dtype: type) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError):
        raise SFBError(f"{name} must be a vector of numbers") from None
    if array.ndim != 1:
        raise SFBError(f"{name} must be a vector, got shape {array.shape}")
    return array


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and bool(np.isfinite(value)) and value > 0


def _non_negative(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and bool(np.isfinite(value)) and value >= 0
