"""SFB kept where the simulator says it helps.

The program's saving (:mod:`tag.sfb.plan`) assumes serialised transfers; in a simulated iteration an
all-reduce often overlaps compute and the new broadcasts queue behind other traffic, so a plan the
program likes can be slower. :func:`select_sfb` simulates the strategy with SFB in every group the program
chose, then toggles each group once (least estimated saving first) and keeps a toggle when the simulated
iteration gets faster. The result is never slower than the strategy without SFB.
"""

from __future__ import annotations

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
    time_all_s: float  # SFB in every group the program chose
    time_s: float  # SFB in the groups kept: min over what was tried, ≤ time_without_s
    simulations: int

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
                "solve_time_s": self.proposed.solve_time_s}


def select_sfb(group_graph: GroupGraph, strategy: Strategy, cluster: Cluster, *, cost: CostModel | None = None,
               cache: SFBCache | None = None, granularity: str = "group",
               time_without_s: float | None = None) -> SFBSelection:
    """SFB for ``strategy``, kept group by group where a simulation of the whole iteration gets faster."""
    simulations = 0

    def simulate(plan: SFBPlan | None) -> float:
        nonlocal simulations
        simulations += 1
        graph = group_graph if plan is None or not plan.groups else plan.rewritten_group_graph()
        result = compile_strategy(graph, strategy, cluster, cost=cost, granularity=granularity).simulate(feedback=False)
        return result.iteration_time if result.feasible else float("inf")

    base = simulate(None) if time_without_s is None else time_without_s
    full = apply_sfb(group_graph, strategy, cluster, cost=cost, cache=cache)
    if not full.groups:
        return SFBSelection(full, full.report(), base, base, base, simulations)
    whole = simulate(full)
    kept, kept_time = (full, whole) if whole < base else (full.restricted([]), base)
    if len(full.groups) > 1:
        for group in sorted(full.groups, key=lambda g: g.time_saved_s):
            chosen = {g.group for g in kept.groups} ^ {group.group}
            trial = full.restricted(chosen)
            elapsed = simulate(trial) if chosen else base
            if elapsed < kept_time:
                kept, kept_time = trial, elapsed
    return SFBSelection(kept, full.report(), base, whole, kept_time, simulations)

