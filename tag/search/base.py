"""What the search and its evaluators share: the state an evaluator sees and the evaluator's type.

The search never imports the GNN (DESIGN.md: Policy and search). It calls an :data:`Evaluator` on a
:class:`PlacementState` and gets prior probabilities over the candidate actions of the state's next group.
The GNN of :mod:`tag.policy` is one evaluator; :func:`uniform_evaluator` ("pure MCTS") is another.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

from tag.cluster import Cluster
from tag.grouping import GroupGraph
from tag.sim.result import Feedback
from tag.strategy import Strategy

__all__ = ["PlacementState", "Evaluator", "BatchEvaluator", "uniform_evaluator", "uniform_batch_evaluator",
           "frozen_gc"]


class PlacementState(NamedTuple):
    """A vertex of the placement search tree, as an evaluator sees it. G groups, M device groups, A actions."""

    group_graph: GroupGraph
    cluster: Cluster
    strategy: Strategy  # decided groups as chosen; undecided groups hold the default fill (TAG footnote 2)
    decided: np.ndarray  # [G] bool, groups already decided on the path from the root
    next_group: int  # the group the next action decides; -1 at a terminal state
    masks: np.ndarray  # [A, M] bool, candidate placements of next_group
    options: np.ndarray  # [A] int8, candidate options (index into tag.strategy.OPTIONS)
    feedback: Feedback | None  # simulator feedback of ``strategy``; None before the first simulation


Evaluator = Callable[[PlacementState], np.ndarray]
"""state → priors [A] over the candidate actions, non-negative, summing to 1."""

BatchEvaluator = Callable[[Sequence[PlacementState]], list[np.ndarray]]
"""Several states at once (one GNN forward for many leaves); same contract per state."""


def uniform_evaluator(state: PlacementState) -> np.ndarray:
    """Equal priors over the candidate actions: "pure MCTS"."""
    count = len(state.options)
    return np.full(count, 1.0 / count) if count else np.zeros(0)


def uniform_batch_evaluator(states: Sequence[PlacementState]) -> list[np.ndarray]:
    """:func:`uniform_evaluator` over several states."""
    return [uniform_evaluator(state) for state in states]


@contextlib.contextmanager
def frozen_gc() -> Iterator[None]:
    """Keep the objects alive on entry out of the cyclic garbage collector's scans until exit.

    A search allocates as it goes (fragments, cached plans, tree states), so the collector runs often, and
    each full collection walks every object of the process: the model, its grouping and the compiler's
    tables, hundreds of thousands that live as long as the search. Frozen (``gc.freeze``), they are not
    scanned; on exit they are handed back (``gc.unfreeze``), so nothing stays permanent in a long-lived
    process. Nested or inside a caller's own freeze, it does nothing (the outer freeze holds). Nesting is
    told by a counter: ``gc.get_freeze_count()`` walks every frozen object (16 ms at 166k objects, three
    times a 64-device learned map), so it is asked only outside every frozen_gc.
    """
    nested = _FREEZES[0] > 0 or gc.get_freeze_count() > 0
    _FREEZES[0] += 1
    if not nested:
        gc.freeze()
    try:
        yield
    finally:
        _FREEZES[0] -= 1
        if not nested:
            gc.unfreeze()


_FREEZES = [0]  # frozen_gc blocks open now
