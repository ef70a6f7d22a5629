"""SFB kept where the simulator says it helps.

The program's saving (:mod:`tag.sfb.plan`) assumes serialised transfers; in a simulated iteration an
all-reduce often overlaps compute and the new broadcasts queue behind other traffic, so a plan the
program likes can be slower. :func:`select_sfb` simulates the strategy with SFB in every group the program
chose, then toggles each group once (least estimated saving first) and keeps a toggle when the simulated
iteration gets faster. The result is never slower than the strategy without SFB.

With a ``deadline`` the programs are solved in the time left (:func:`tag.sfb.apply_sfb`) and a simulation
is started only while one, and the ``reserve`` simulations the caller keeps for after, still fit before it
(judged by the simulations timed so far); the toggles not tried are reported, and the best plan
simulated so far is kept, so the result is still never slower than the strategy without SFB.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from tag.cluster import Cluster
from tag.compiler import compile_strategy
from tag.cost import CostModel
from tag.grouping import GroupGraph
from tag.sfb.plan import SFBPlan, SFBReport, apply_sfb
from tag.sfb.program import SFBCache
from tag.strategy import Strategy

__all__ = ["SFBSelection", "select_sfb"]


class SFBSelection(NamedTuple):
    """The SFB kept for one strategy, with simulated times (seconds per iteration; inf when OOM)."""

    plan: SFBPlan  # restricted to the groups kept
    proposed: SFBReport  # what the program proposed, before the simulator's check
    time_without_s: float  # the strategy alone
    time_all_s: float | None  # SFB in every group the program chose (None: the deadline left it unsimulated)
    time_s: float  # SFB in the groups kept: min over what was tried, ≤ time_without_s
    simulations: int
    untried: int = 0  # groups whose toggle the deadline left untried (all of them when ``whole`` was not run)
    deadline_reached: bool = False  # the deadline cut the programs or the simulations short

    @property
    def applied(self) -> bool:
        return bool(self.plan.groups)

    def as_dict(self) -> dict:
        kept = self.plan.report()
        return {"groups_examined": len(self.proposed.groups), "groups_kept": len(self.plan.groups),
                "gradients": self.proposed.gradients, "gradients_replaced": kept.applied,
                "ops_duplicated": kept.ops_duplicated, "allreduce_bytes_removed": kept.allreduce_bytes_removed,
                "broadcast_bytes_added": kept.broadcast_bytes_added,
                "estimated_time_saved_s": kept.estimated_time_saved_s, "time_without_s": self.time_without_s,
                "time_all_groups_s": self.time_all_s, "time_s": self.time_s,
                "simulated_time_saved_s": self.time_without_s - self.time_s, "simulations": self.simulations,
                "solve_time_s": self.proposed.solve_time_s, "deadline_reached": self.deadline_reached,
                "groups_untried": self.untried}


def select_sfb(group_graph: GroupGraph, strategy: Strategy, cluster: Cluster, *, cost: CostModel | None = None,
               cache: SFBCache | None = None, granularity: str = "group", time_without_s: float | None = None,
               deadline: float | None = None, reserve: float = 0.0) -> SFBSelection:
    """SFB for ``strategy``, kept group by group where a simulation of the whole iteration gets faster.
    ``deadline`` (a ``time.perf_counter()`` instant) and ``reserve`` (simulations' worth of time to leave
    before it): module docstring."""
    durations: list[float] = []

    def simulate(plan: SFBPlan | None) -> float:
        start = time.perf_counter()
        graph = group_graph if plan is None or not plan.groups else plan.rewritten_group_graph()
        result = compile_strategy(graph, strategy, cluster, cost=cost, granularity=granularity).simulate(feedback=False)
        durations.append(time.perf_counter() - start)
        return result.iteration_time if result.feasible else float("inf")

    def fits() -> bool:  # one more simulation and the reserve before the deadline
        if deadline is None:
            return True
        mean = sum(durations) / len(durations) if durations else 0.0
        return time.perf_counter() + (1.0 + reserve) * mean < deadline

    base = simulate(None) if time_without_s is None else time_without_s
    full = apply_sfb(group_graph, strategy, cluster, cost=cost, cache=cache, deadline=deadline)
    cut = deadline is not None and time.perf_counter() >= deadline
    if not full.groups:
        return SFBSelection(full, full.report(), base, base, base, len(durations), 0, cut)
    if not fits():
        return SFBSelection(full.restricted([]), full.report(), base, None, base, len(durations),
                            len(full.groups), True)
    whole = simulate(full)
    kept, kept_time = (full, whole) if whole < base else (full.restricted([]), base)
    toggles = sorted(full.groups, key=lambda g: g.time_saved_s) if len(full.groups) > 1 else []
    untried = 0
    for k, group in enumerate(toggles):
        chosen = {g.group for g in kept.groups} ^ {group.group}
        if chosen and not fits():
            untried, cut = len(toggles) - k, True
            break
        trial = full.restricted(chosen)
        elapsed = simulate(trial) if chosen else base
        if elapsed < kept_time:
            kept, kept_time = trial, elapsed
    return SFBSelection(kept, full.report(), base, whole, kept_time, len(durations), untried, cut)
