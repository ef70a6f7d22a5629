"""The placement environment of TAG §4.2.2: one tree level per op group, an action per candidate (mask, option).

The root is the empty assignment. Level k decides op group ``order[k]``, groups taken in descending
compute time (:meth:`GroupGraph.order_by_compute`), so the most expensive group is decided first. A
state is the tuple of action indices chosen so far; every group shares one candidate set (masks [A, M],
options [A]).

**Default fill** (TAG footnote 2). A state is scored as a complete strategy: undecided groups take the
strategy of the most expensive decided group, which is the first decided; at the root, where nothing is
decided, every group takes DP-NCCL's (every device group, all-reduce). The root's plan is therefore
DP-NCCL itself. Two variants: fill ``"root"`` gives every undecided group its DP-NCCL strategy at every
depth, and fill ``"staged"`` its strategy in :func:`tag.search.staged.staged_strategy`, a plan of
contiguous layer runs on device groups built to fit memory (DP-NCCL when none is found), for models
whose data-parallel plans do not fit.

**Reward.** ``t_ref / t − 1`` for a plan that fits, t its simulated iteration time; ``−1`` on OOM. So
DP-NCCL scores 0, a plan twice as fast 1, and an OOM plan what an infinitely slow one would tend to:
feasible plans always score above OOM ones.

**Reference time.** DP-NCCL's simulated time when DP-NCCL fits. When it does not, the reference is the
*single-device compute time*: the summed compute time of every op group on the cluster's fastest GPU
type (no communication, memory ignored), which needs no simulation and is what one such device would
take were its memory large enough; :attr:`PlacementEnv.reference_name` says which one is used.

Simulations are cached by strategy: many leaves fill to the same complete strategy (a child that
repeats its parent's first action, for one).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tag.cluster import Cluster
from tag.compiler import CompilerCache, evaluate_strategy
from tag.cost import CostModel
from tag.grouping import GroupGraph
from tag.search.base import PlacementState
from tag.search.env import LeafEvaluation
from tag.search.errors import SearchError
from tag.search.staged import staged_strategy
from tag.sim.result import Feedback
from tag.strategy import ALLREDUCE, DEFAULT_MAX_DEVICE_GROUPS, Strategy, candidate_actions, restricted_actions
from tag.strategy.strategy import device_group_sizes

__all__ = ["PlacementEnv", "Placement", "Simulated", "placement_candidates", "group_order", "ORDERS", "FILLS",
           "OOM_REWARD", "DP_NCCL", "SINGLE_DEVICE_COMPUTE"]

OOM_REWARD = -1.0  # TAG §4.2.2: "If an OOM error results, the reward is set to -1"
DP_NCCL = "DP-NCCL"
SINGLE_DEVICE_COMPUTE = "single-device compute"

Placement = tuple[int, ...]  # a state: the action index chosen for order[0], order[1], ...

ORDERS = ("compute", "impact")  # level order: TAG's descending compute, or compute + gradient sync estimate
FILLS = ("first", "root", "staged")  # undecided groups: the first decided group's strategy (TAG), DP-NCCL's,
# or that of a memory-fitting plan of layer runs on device groups (tag.search.staged)


def group_order(group_graph: GroupGraph, cluster: Cluster, order: str = "compute") -> np.ndarray:
    """[G] the op group each tree level decides.

    ``"compute"`` (TAG §4.2.2): descending compute time. ``"impact"``: descending compute time plus the
    ring all-reduce time of the group's parameters over every device at the cluster's slowest link, the
    group's share of a DP-NCCL iteration; it puts a group with large weights and little compute (VGG's
    fully connected layers) near the root, where a search with few iterations still reaches it.
    """
    if order == "compute":
        return group_graph.order_by_compute()
    compute = group_graph.compute_table(cluster).mean(axis=1)  # [G]
    n = cluster.num_devices
    bandwidth = cluster.bandwidth[~np.eye(n, dtype=bool)].min() if n > 1 else np.inf
    sync = 2.0 * (n - 1) / n * group_graph.param_bytes / bandwidth  # [G]
    return np.argsort(-(compute + sync), kind="stable")


class Simulated(NamedTuple):
    """What the cache keeps of one simulated strategy."""

    time: float  # iteration time, seconds (with unlimited memory when not feasible)
    feasible: bool
    oom_device: int  # -1 when feasible
    feedback: Feedback | None
    overflow: float = 0.0  # max over devices of peak memory / capacity − 1; 0 when feasible


def placement_candidates(cluster: Cluster, *, max_device_groups: int = DEFAULT_MAX_DEVICE_GROUPS
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Candidate actions of every group: all masks (:func:`candidate_actions`) when the cluster has at most
    ``max_device_groups`` device groups, else :func:`restricted_actions`. Returns (masks [A, M], options [A])."""
    if cluster.num_device_groups <= max_device_groups:
        return candidate_actions(cluster, max_device_groups=max_device_groups)
    return restricted_actions(cluster)


class PlacementEnv:
    """Per-group placement search over ``group_graph`` on ``cluster`` (module docstring).

    ``candidates``: (masks [A, M], options [A]) shared by every group; default
    :func:`placement_candidates`. ``cost``, ``granularity``: passed to
    :func:`~tag.compiler.compile_strategy`. ``batch_split``: of the strategies searched ("even" as in the
    paper, or "speed"); the DP-NCCL reference always splits evenly. ``keep_feedback``: keep the
    simulator's feedback of every cached strategy for the evaluator (cheap next to compiling).
    ``compiler_cache``: the compiler's tables, layouts and fragments (:class:`~tag.compiler.CompilerCache`),
    shared with the caller's other environments on the same grouping and cluster (None: the environment's own).

    One environment holds one cache of results: give each search a fresh environment to compare budgets fairly.
    """

    def __init__(self, group_graph: GroupGraph, cluster: Cluster, *,
                 candidates: tuple[np.ndarray, np.ndarray] | None = None, cost: CostModel | None = None,
                 granularity: str = "group", batch_split: str = "even", keep_feedback: bool = True,
                 order: str = "compute", fill: str = "first", graded_oom: bool = False,
                 compiler_cache: CompilerCache | None = None) -> None:
        if order not in ORDERS:
            raise SearchError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        if fill not in FILLS:
            raise SearchError(f"fill must be one of {', '.join(FILLS)}, got {fill!r}")
        self.fill = fill
        self.graded_oom = graded_oom
        self.compiler_cache = compiler_cache if compiler_cache is not None else CompilerCache()
        self.group_graph = group_graph
        self.cluster = cluster
        self.cost = cost
        self.granularity = granularity
        self.batch_split = batch_split
        self.keep_feedback = keep_feedback
        self.num_groups = group_graph.num_groups
        self.order = group_order(group_graph, cluster, order)  # [G] the group decided at each level
        masks, options = placement_candidates(cluster) if candidates is None else candidates
        self.masks = np.asarray(masks, dtype=bool)  # [A, M]
        self.options = np.asarray(options, dtype=np.int8)  # [A]
        self._check_candidates()
        self.device_group_sizes = device_group_sizes(cluster)  # [M]
        self.num_simulations = 0
        self.num_oom = 0  # simulated strategies that did not fit
        self._cache: dict[Strategy, Simulated] = {}
        self.dp_nccl = Strategy.data_parallel(self.num_groups, cluster, option=ALLREDUCE)
        self._root_fill = Strategy.data_parallel(self.num_groups, cluster, option=ALLREDUCE, batch_split=batch_split)
        if fill == "staged":
            staged = staged_strategy(group_graph, cluster, cost=cost, granularity=granularity, batch_split=batch_split,
                                     cache=self.compiler_cache)
            self._root_fill = staged if staged is not None else self._root_fill
        dp = self.simulate(self.dp_nccl)
        if dp.feasible:
            self.reference_time, self.reference_name = dp.time, DP_NCCL
        else:
            self.reference_time = float(group_graph.compute_table(cluster).sum(axis=0).min())
            self.reference_name = SINGLE_DEVICE_COMPUTE
        self.num_simulations = 0  # the reference is not part of any search's budget

    def _check_candidates(self) -> None:
        masks, options = self.masks, self.options
        m = self.cluster.num_device_groups
        if masks.ndim != 2 or masks.shape[1] != m or options.shape != (masks.shape[0],) or not len(options):
            raise SearchError(f"candidates must be (masks [A, {m}], options [A]) with A ≥ 1, got shapes "
                              f"{masks.shape} and {options.shape}")
        if not masks.any(axis=1).all():
            raise SearchError(f"candidate {int(np.flatnonzero(~masks.any(axis=1))[0])} has an empty mask")

    @property
    def num_candidates(self) -> int:
        return len(self.options)

    # ------------------------------------------------------------------ the tree (SearchEnv)

    def root(self) -> Placement:
        return ()

    def num_actions(self, state: Placement) -> int:
        return self.num_candidates if len(state) < self.num_groups else 0

    def valid_actions(self, state: Placement) -> np.ndarray:
        """[A] bool: every candidate (the hook where a placement known not to fit would be masked)."""
        return np.ones(self.num_actions(state), dtype=bool)

    def step(self, state: Placement, action: int) -> Placement:
        if len(state) >= self.num_groups:
            raise SearchError("every op group is decided: a terminal state has no actions")
        if not 0 <= action < self.num_candidates:
            raise SearchError(f"action {action} is not a candidate (0..{self.num_candidates - 1})")
        return state + (int(action),)

    def strategy(self, state: Placement) -> Strategy:
        """The complete strategy of ``state``: its decisions, the default fill elsewhere."""
        depth = len(state)
        if depth == 0:
            return self._root_fill
        actions = np.asarray(state, dtype=np.int64)
        if self.fill == "first":
            first = actions[0]
            placement = np.repeat(self.masks[first][None, :], self.num_groups, axis=0)  # [G, M]
            option = np.full(self.num_groups, self.options[first], dtype=np.int8)  # [G]
        else:
            placement = self._root_fill.placement.copy()  # [G, M]
            option = self._root_fill.option.copy()  # [G]
        decided = self.order[:depth]
        placement[decided] = self.masks[actions]
        option[decided] = self.options[actions]
        return Strategy(placement, option, self.device_group_sizes, self.batch_split)

    def evaluate(self, state: Placement) -> LeafEvaluation:
        return self.score(self.strategy(state))

    def observe(self, state: Placement) -> PlacementState:
        depth = len(state)
        decided = np.zeros(self.num_groups, dtype=bool)
        decided[self.order[:depth]] = True
        strategy = self.strategy(state)
        terminal = depth >= self.num_groups
        return PlacementState(
            group_graph=self.group_graph,
            cluster=self.cluster,
            strategy=strategy,
            decided=decided,
            next_group=-1 if terminal else int(self.order[depth]),
            masks=self.masks[:0] if terminal else self.masks,
            options=self.options[:0] if terminal else self.options,
            feedback=self.simulate(strategy).feedback,
        )

    def baseline(self) -> LeafEvaluation:
        return self.score(self.dp_nccl)

    # ------------------------------------------------------------------ scoring

    def simulate(self, strategy: Strategy) -> Simulated:
        """Compile and simulate ``strategy`` (cached)."""
        hit = self._cache.get(strategy)
        if hit is not None:
            return hit
        result = evaluate_strategy(self.group_graph, strategy, self.cluster, cost=self.cost,
                                   granularity=self.granularity, feedback=self.keep_feedback,
                                   cache=self.compiler_cache)
        overflow = 0.0 if result.feasible else float(np.max(result.peak_memory / result.memory_capacity)) - 1.0
        simulated = Simulated(result.iteration_time, result.feasible, result.oom_device, result.feedback, overflow)
        self._cache[strategy] = simulated
        self.num_simulations += 1
        self.num_oom += not result.feasible
        return simulated

    def reward(self, time_s: float, feasible: bool, overflow: float = 0.0) -> float:
        """t_ref / t − 1 when the plan fits, −1 on OOM (module docstring). With ``graded_oom``, an OOM plan
        scores −1 − min(1, overflow) instead, overflow being how far the fullest device is over its memory
        (0.25: 25% over), so that when nothing simulated fits yet the search moves toward plans that nearly
        do; feasible plans still always score above OOM ones."""
        if not feasible:
            return OOM_REWARD - min(1.0, overflow) if self.graded_oom else OOM_REWARD
        return self.reference_time / time_s - 1.0 if time_s > 0 else np.inf

    def score(self, strategy: Strategy) -> LeafEvaluation:
        """``strategy`` simulated (cached) and scored."""
        simulated = self.simulate(strategy)
        return LeafEvaluation(self.reward(simulated.time, simulated.feasible, simulated.overflow), strategy,
                              simulated.time,
                              simulated.feasible)
