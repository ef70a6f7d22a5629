"""What the MCTS core needs from a search environment, and what an evaluated leaf returns.

An environment defines a tree of decisions: a root state, the candidate actions of a state, the state an
action leads to, and the value of a state (its plan, completed by the environment's default fill, scored
by the simulator). :class:`~tag.search.placement.PlacementEnv` decides op group by op group (TAG
§4.2.2); a mapping environment (one level per pipeline stage replica, action = device) fits the same
protocol. The core never looks inside a state: states are opaque, hashable values the environment
hands back to itself.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

__all__ = ["SearchEnv", "LeafEvaluation", "State", "Observation"]

State = TypeVar("State")
Observation = TypeVar("Observation")


class LeafEvaluation(NamedTuple):
    """A state's plan as the simulator scored it."""

    value: float  # the reward backed up the tree (the environment defines its scale)
    candidate: Any  # the complete plan that was simulated (a Strategy for placement)
    time: float  # its simulated iteration time, seconds (with unlimited memory when not feasible)
    feasible: bool  # it fits in every device's memory


class SearchEnv(Protocol[State, Observation]):
    """The interface :func:`~tag.search.mcts.mcts_search` drives."""

    reference_time: float  # seconds: the plan searches are measured against (DP-NCCL for placement)
    reference_name: str
    num_simulations: int  # distinct plans simulated so far (cache misses)

    def root(self) -> State:
        """The empty assignment."""

    def num_actions(self, state: State) -> int:
        """A: candidate actions of ``state``; 0 at a terminal state."""

    def valid_actions(self, state: State) -> np.ndarray:
        """[A] bool: the actions that may be taken (the search masks the others before selection)."""

    def step(self, state: State, action: int) -> State:
        """The state ``action`` leads to."""

    def evaluate(self, state: State) -> LeafEvaluation:
        """Fill what ``state`` leaves undecided, simulate (cached), and score it."""

    def observe(self, state: State) -> Observation:
        """What an evaluator sees of ``state`` (with the simulator's feedback of its filled plan)."""

    def baseline(self) -> LeafEvaluation:
        """The reference plan, simulated: every search counts it among its candidates."""
