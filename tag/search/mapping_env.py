"""The mapping environment: the shared MCTS places pipeline stage replicas on devices (DESIGN.md: Policy
and search, "the learned mapper").

A :class:`~tag.exact.MappingProblem` (S stages × R replicas onto D devices) becomes a tree of S·R levels.
Level k decides slot k: stages in the exact mapper's connectivity order (each stage as soon after its
neighbours as possible, so a stage's time is known early), a stage's R replicas one after another. An
action is a device; the devices already used are masked.

**Default fill.** A state is scored as a complete mapping: the undecided slots take the unused devices
in ascending id, slot by slot, which is the consecutive (CS) map of what is left; or, given ``fill``,
what that callable completes the state to (the learned mapper's greedy decode, tag.policy.mapping).

**Value** (DESIGN.md): lower bound / achieved max stage time, in (0, 1], with the exact mapper's
objective (eq. 5 under the instantiation :func:`~tag.exact.choose_instantiation` picks) and its
assignment lower bound; 1 means the mapping is provably optimal. The reference, which every search
counts among its candidates, is the CS map.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from tag.exact._mapping_kernel import connectivity_order
from tag.exact.heuristics import cs_map
from tag.exact.mapping import MappingProblem, StageTimer, assignment_lower_bound, choose_instantiation
from tag.search.env import LeafEvaluation
from tag.search.errors import SearchError

__all__ = ["MappingEnv", "MappingObservation", "uniform_mapping_evaluator", "CS_MAP"]

CS_MAP = "CS map"
UNASSIGNED = -1

Slots = tuple[int, ...]  # a state: the device chosen for slot 0, 1, ...
Fill = Callable[[Slots], Sequence[int]]  # a state → the device of every slot [K], the state's first


class MappingObservation(NamedTuple):
    """A vertex of the mapping tree as an evaluator sees it. K = S·R slots, D devices."""

    problem: MappingProblem
    slot_stage: np.ndarray  # [K] int64 stage of each slot (the tree's order)
    slot_replica: np.ndarray  # [K] int64 replica of each slot
    assigned: np.ndarray  # [K] int64 device of each decided slot, UNASSIGNED for the others
    next_slot: int  # the slot the next action decides; -1 at a terminal state
    valid: np.ndarray  # [D] bool devices the next action may take


def uniform_mapping_evaluator(observation: MappingObservation) -> np.ndarray:
    """Equal priors over the devices: pure MCTS for mapping (invalid ones are masked by the search)."""
    count = len(observation.valid)
    return np.full(count, 1.0 / count) if count else np.zeros(0)


class MappingEnv:
    """MCTS over stage-replica → device assignments of ``problem`` (module docstring)."""

    def __init__(self, problem: MappingProblem, *, instantiation: str | None = None,
                 lower_bound: float | None = None, fill: Fill | None = None) -> None:
        self.problem = problem
        self.fill = fill
        self.instantiation = choose_instantiation(problem) if instantiation is None else instantiation
        self.lower_bound = (assignment_lower_bound(problem, self.instantiation) if lower_bound is None
                            else float(lower_bound))
        stages, replicas = problem.num_stages, problem.num_replicas
        self.num_devices = problem.num_devices  # MappingProblem checks S·R ≤ D
        pairs = sorted({(min(a, b), max(a, b)) for a, b in zip(problem.edge_src.tolist(), problem.edge_dst.tolist())})
        order = connectivity_order(stages, np.asarray(pairs, dtype=np.int64).reshape(-1, 2))
        self.slot_stage = np.repeat(np.asarray(order, dtype=np.int64), replicas)  # [K]
        self.slot_replica = np.tile(np.arange(replicas, dtype=np.int64), stages)  # [K]
        self.num_slots = stages * replicas
        self.num_simulations = 0
        self._cache: dict[tuple[int, ...], float] = {}
        self._timer = StageTimer(problem, self.instantiation)
        self._cs = cs_map(problem)
        self.reference_time = self._time(self._cs)
        self.reference_name = CS_MAP
        self.num_simulations = 0  # the reference is not part of any search's budget

    # ------------------------------------------------------------------ the tree (SearchEnv)

    def root(self) -> Slots:
        return ()

    def num_actions(self, state: Slots) -> int:
        return self.num_devices if len(state) < self.num_slots else 0

    def valid_actions(self, state: Slots) -> np.ndarray:
        """[D] bool: the devices no decided slot holds."""
        valid = np.ones(self.num_actions(state), dtype=bool)
        if len(valid):
            valid[list(state)] = False
        return valid

    def step(self, state: Slots, action: int) -> Slots:
        if len(state) >= self.num_slots:
            raise SearchError("every stage replica is placed: a terminal state has no actions")
        if not 0 <= action < self.num_devices or action in state:
            raise SearchError(f"device {action} is not free (0..{self.num_devices - 1}, not in {list(state)})")
        return state + (int(action),)

    def mapping(self, state: Slots) -> np.ndarray:
        """[S, R] the complete mapping of ``state``: its decisions, then the fill's (by default the unused
        devices in ascending order on the undecided slots)."""
        if self.fill is not None:
            devices = np.asarray(self.fill(state), dtype=np.int64)  # [K]
            if (devices.shape != (self.num_slots,) or tuple(devices[:len(state)].tolist()) != state
                    or devices.min(initial=0) < 0 or devices.max(initial=0) >= self.num_devices
                    or np.bincount(devices, minlength=self.num_devices).max(initial=0) > 1):
                raise SearchError(f"the fill gave {devices.tolist()} for state {list(state)}: it must extend "
                                  f"the state to {self.num_slots} distinct devices")
        else:
            devices = np.full(self.num_slots, UNASSIGNED, dtype=np.int64)  # [K]
            devices[:len(state)] = state
            free = np.setdiff1d(np.arange(self.num_devices), np.asarray(state, dtype=np.int64))
            devices[len(state):] = free[:self.num_slots - len(state)]
        mapping = np.empty((self.problem.num_stages, self.problem.num_replicas), dtype=np.int64)
        mapping[self.slot_stage, self.slot_replica] = devices
        return mapping

    def evaluate(self, state: Slots) -> LeafEvaluation:
        return self.score(self.mapping(state))

    def observe(self, state: Slots) -> MappingObservation:
        assigned = np.full(self.num_slots, UNASSIGNED, dtype=np.int64)
        assigned[:len(state)] = state
        terminal = len(state) >= self.num_slots
        return MappingObservation(self.problem, self.slot_stage, self.slot_replica, assigned,
                                  -1 if terminal else len(state), self.valid_actions(state))

    def baseline(self) -> LeafEvaluation:
        return self.score(self._cs)

    # ------------------------------------------------------------------ scoring

    def score(self, mapping: np.ndarray) -> LeafEvaluation:
        """The leaf of a valid [S, R] int64 ``mapping`` (:meth:`mapping` checks what a fill gives)."""
        time = self._time(mapping)
        value = self.lower_bound / time if time > 0 else 1.0
        return LeafEvaluation(value, mapping, time, True)

    def _time(self, mapping: np.ndarray) -> float:
        key = tuple(mapping.reshape(-1).tolist())
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._timer.max_time(mapping)
            self.num_simulations += 1
        return hit
