"""The TAG planner end to end (TAG §4): grouping → search → SFB → compile → simulate.

:func:`plan_training` is what ``tag plan`` runs. The search (MCTS with the priors of an evaluator, or the
MCMC baseline) scores each candidate by simulation against DP-NCCL; SFB (:func:`tag.sfb.select_sfb`) is
applied to the best strategy afterwards and kept only where the simulator says it helps; the final plan is
compiled with and without Horovod-style gradient fusion, and the faster simulated with feedback for the
report. Every figure in the outcome is simulated.

When DP-NCCL does not fit, no data-parallel plan can start the search: the searches then use the
``oom_fills``, first the "staged" fill (:mod:`tag.search.staged`: contiguous layer runs on device groups,
built to fit memory), whose plan also joins the final pass.

A ``deadline`` (:attr:`PlanConfig.deadline`, what :func:`tag.planners.plan_fastest` gives the placement
family) bounds the whole call: the search ends by :data:`SEARCH_SHARE` of the time left when it starts
(or its own ``time_limit_s``, if sooner), SFB stops trying groups in time for the final pass
(:data:`FINAL_RESERVE` simulations' worth before the deadline) and keeps its best so far, and a start
reached after the deadline is finalised without SFB only if its simulated time already beats the best
plan so far (else left out; :attr:`PlanOutcome.skipped` names it). The call then ends within about one
final pass (two compilations and simulations of one plan) of the deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tag.baselines import BaselineResult, run_baselines
from tag.cluster import Cluster
from tag.compiler import DEFAULT_FUSION_BYTES, CompiledPlan, CompilerCache, compile_strategy
from tag.cost import CostModel
from tag.graph import OpGraph
from tag.grouping import DEFAULT_NUM_GROUPS, GroupGraph, group_ops
from tag.search import (
    DEFAULT_C_PUCT,
    BatchEvaluator,
    Evaluator,
    PlacementEnv,
    ProgressCallback,
    SearchProgress,
    SearchResult,
    mcmc_search,
    mcts_search,
    uniform_evaluator,
)
from tag.sfb import SFBCache, SFBSelection, select_sfb
from tag.sim import SimulationResult
from tag.strategy import OPTIONS, Strategy

__all__ = ["PlanConfig", "PlanOutcome", "Priors", "plan_training", "load_priors", "DEFAULT_ITERATIONS",
           "COMPARED_BASELINES", "SEARCHES", "TAG_MODELS", "TAG_CLUSTERS", "SEARCH_SHARE", "FINAL_RESERVE"]

DEFAULT_ITERATIONS = 600  # MCTS iterations when neither an iteration nor a time budget is given
SEARCH_SHARE = 0.8  # of the time left before a deadline when the search starts: the rest is SFB's and the final pass's
FINAL_RESERVE = 2.0  # simulations' worth of time SFB leaves before a deadline: the final pass compiles the plan twice
COMPARED_BASELINES = ("dp-nccl", "dp-nccl-p", "horovod")  # the speed-ups `tag plan` reports (TAG Table 8)
SEARCHES = ("mcts", "mcmc")
TAG_MODELS = ("inception-v3", "resnet101", "vgg19", "transformer", "bert-small", "bert-large")  # TAG §5.1
TAG_CLUSTERS = ("tag-testbed", "tag-cloud")  # TAG §5.1's testbed and cloud


class Priors(NamedTuple):
    """Where the search's priors come from."""

    evaluator: Evaluator
    batch_evaluator: BatchEvaluator | None
    label: str  # for reports: "uniform priors (pure MCTS)" or the checkpoint


def load_priors(checkpoint: str | None) -> Priors:
    """The GNN policy of ``checkpoint`` (torch imported only then), or uniform priors ("pure MCTS") for None."""
    if not checkpoint:
        return Priors(uniform_evaluator, None, "uniform priors (pure MCTS)")
    import torch

    from tag.policy import GNNEvaluator, load_policy

    torch.set_num_threads(1)  # one small forward per vertex: threads only add contention
    loaded = load_policy(checkpoint)
    evaluator = GNNEvaluator(loaded.model)
    return Priors(evaluator, evaluator.batch, f"GNN policy {checkpoint} (step {loaded.step})")


@dataclass(frozen=True)
class PlanConfig:
    """What ``tag plan`` gathers from its flags."""

    num_groups: int = DEFAULT_NUM_GROUPS  # METIS op groups (TAG §5.1 used 60)
    max_iterations: int | None = None  # search iterations; with no time limit either, DEFAULT_ITERATIONS
    time_limit_s: float | None = None  # wall-clock budget of the search
    search: str = "mcts"  # "mcts" (TAG) or "mcmc" (FlexFlow-style baseline on the same simulator)
    sfb: bool = True  # apply sufficient-factor broadcasting after the search
    fusion: bool = True  # also try the final plan with Horovod-style gradient fusion buckets; keep the faster
    c_puct: float = DEFAULT_C_PUCT  # exploration constant c of TAG §4.2.2
    order: str = "impact"  # tree level order (tag.search.group_order); TAG's is "compute"
    fills: tuple[str, ...] = ("first", "root")  # MCTS runs once per default fill, the budget split among them
    # The fills whose trees the evaluator's priors guide; the other trees get uniform priors. The shipped
    # policy is trained with TAG's first-group fill, where the root decision sets the default strategy of
    # every group (DP-NCCL's action is nearly always right there). Under the "root" fill the same root
    # state asks which one group should leave DP-NCCL, and the policy's features cannot tell the two apart:
    # its priors at 60 groups put 25% on DP-NCCL's own action there, which beats nothing.
    policy_fills: tuple[str, ...] = ("first",)
    # the fills when DP-NCCL does not fit: DP-NCCL's own fill would only ever give OOM plans
    oom_fills: tuple[str, ...] = ("staged", "first")
    batch_split: str = "even"  # of searched strategies: "even" (the paper) or "speed" (batch ∝ device speed)
    granularity: str = "group"  # task granularity of every compiled plan ("group": the search's fast path)
    seed: int = 0  # METIS and search tie-breaking
    # a time.perf_counter() instant the whole plan_training call ends by (module docstring); not a flag:
    # plan_fastest sets it from the placement family's share
    deadline: float | None = None

    def budget(self) -> tuple[int | None, float | None]:
        if self.max_iterations is None and self.time_limit_s is None:
            return DEFAULT_ITERATIONS, None
        return self.max_iterations, self.time_limit_s


class PlanOutcome(NamedTuple):
    """A plan and everything ``tag plan`` reports about it."""

    graph: OpGraph
    group_graph: GroupGraph  # as grouped by METIS (without SFB's rewrite)
    cluster: Cluster
    strategy: Strategy
    compiled: CompiledPlan  # the final plan, SFB included where kept
    result: SimulationResult  # its simulation, with feedback
    search: SearchResult
    baselines: list[BaselineResult]  # COMPARED_BASELINES, in order
    sfb: SFBSelection | None  # None with sfb=False
    timings: dict[str, float]  # seconds per phase: grouping, baselines, search, sfb, final
    fusion_bytes: float | None = None  # gradient fusion bucket size of the final plan; None: no fusion
    origin: str = "search"  # where the final strategy came from: "search", the baseline that beat it, or "staged"
    skipped: tuple[str, ...] = ()  # the final pass's starts the deadline left out (module docstring)

    @property
    def iteration_time_s(self) -> float:
        return float(self.result.iteration_time)

    def speedup_over(self) -> dict[str, float | None]:
        """Baseline time / plan time per compared baseline; None where the plan or the baseline does not fit
        (an OOM baseline's time is what it would take with unlimited memory: no run to compare with)."""
        out = {}
        for key, baseline in zip(COMPARED_BASELINES, self.baselines):
            ok = self.result.feasible and self.result.iteration_time > 0 and not baseline.oom
            out[key] = baseline.iteration_time_s / self.result.iteration_time if ok else None
        return out

    def group_rows(self) -> list[dict[str, Any]]:
        """One row per op group in descending compute order: placement, option, devices, time."""
        gg, strategy, cluster = self.group_graph, self.strategy, self.cluster
        members = [np.flatnonzero(cluster.device_group == m) for m in range(cluster.num_device_groups)]
        makespan = self.result.feedback.group_makespan if self.result.feedback is not None else None
        compute = gg.compute_table(cluster)  # [G, T] seconds per GPU type of the cluster, whole batch
        sizes = gg.group_sizes()  # [G]
        with_sfb = {s.group for s in self.sfb.plan.groups} if self.sfb is not None else set()
        rows = []
        for g in gg.order_by_compute().tolist():
            placed = np.flatnonzero(strategy.placement[g])
            devices = np.concatenate([members[m] for m in placed])
            rows.append({
                "group": g, "ops": int(sizes[g]), "device_groups": placed.tolist(),
                "devices": devices.tolist(), "option": OPTIONS[int(strategy.option[g])],
                "compute_s": float(compute[g, cluster.device_type[devices]].min()),
                "param_bytes": float(gg.param_bytes[g]),
                "makespan_s": float(makespan[g]) if makespan is not None else None,
                "sfb": g in with_sfb,
            })
        return rows

    def summary(self) -> dict[str, Any]:
        """The figures of ``tag plan --json`` (and of a plan file's summary)."""
        result = self.result
        search = self.search
        return {
            "model": self.graph.meta.get("model", ""), "cluster": self.cluster.name,
            "devices": self.cluster.num_devices, "batch_size": self.graph.batch_size,
            "num_groups": self.group_graph.num_groups,
            "iteration_time_s": float(result.iteration_time), "feasible": bool(result.feasible),
            "samples_per_s": self.graph.batch_size / result.iteration_time if result.iteration_time > 0 else None,
            "speedup_over": self.speedup_over(),
            "baselines": [{"name": key, "iteration_time_s": b.iteration_time_s, "oom": b.oom}
                          for key, b in zip(COMPARED_BASELINES, self.baselines)],
            "search": search.method, "search_time_s": search.search_time_s, "simulations": search.num_simulations,
            "iterations": search.num_iterations, "search_best_time_s": search.best_time,
            "first_beat_iteration": search.first_beat_iteration, "reference": search.reference_name,
            "sfb": self.sfb.as_dict() if self.sfb is not None else None,
            "sfb_groups": [g.group for g in self.sfb.plan.groups] if self.sfb is not None else [],
            "fusion_bytes": self.fusion_bytes, "origin": self.origin, "deadline_skipped": list(self.skipped),
            "peak_memory_bytes": [float(x) for x in result.peak_memory],
            "memory_capacity_bytes": [float(x) for x in result.memory_capacity],
            "oom_device": int(result.oom_device) if result.oom_device >= 0 else None,
            "options": {name: int(np.sum(self.strategy.option == k)) for k, name in enumerate(OPTIONS)},
            "timings_s": self.timings,
        }


def plan_training(graph: OpGraph, cluster: Cluster, *, config: PlanConfig = PlanConfig(),
                  evaluator: Evaluator = uniform_evaluator, batch_evaluator: BatchEvaluator | None = None,
                  batch_size: int = 1, progress: ProgressCallback | None = None,
                  cost: CostModel | None = None) -> PlanOutcome:
    """Plan ``graph`` on ``cluster`` (module docstring). ``evaluator``: priors for MCTS (uniform: "pure
    MCTS"; a :class:`tag.policy.GNNEvaluator` for TAG). ``progress`` is called after every search iteration.
    ``cost``: op times (default the roofline :class:`~tag.cost.CostModel`; a
    :class:`~tag.cost.ProfiledCostModel` for measured ones): the grouping keeps it and every simulation
    of the plan reads it from there."""
    if not config.fills or not config.oom_fills:
        raise ValueError("fills and oom_fills must each name at least one default fill")
    if config.search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {config.search!r}")
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    group_graph = group_ops(graph, num_groups=config.num_groups, gpus=cluster, seed=config.seed, cost=cost)
    timings["grouping"] = _lap(clock)
    clock = time.perf_counter()
    baselines = run_baselines(group_graph, cluster, names=COMPARED_BASELINES, granularity=config.granularity)
    timings["baselines"] = _lap(clock)
    iterations, seconds = config.budget()
    if config.deadline is not None:
        left = max(config.deadline - time.perf_counter(), 0.0) * SEARCH_SHARE
        seconds = max(min(left, seconds if seconds is not None else left), 0.01)
    fills = config.oom_fills if baselines[0].oom else config.fills
    fills = fills if config.search == "mcts" else fills[:1]
    searches, seeds = [], []
    compiler_cache = CompilerCache()  # the searches' compiled fragments, shared by the fills
    for k, fill in enumerate(fills):  # the budget split evenly over the fills, the remainder to the first
        share = None if iterations is None else iterations // len(fills) + (k < iterations % len(fills))
        if share == 0:
            continue
        env = PlacementEnv(group_graph, cluster, granularity=config.granularity, order=config.order, fill=fill,
                           batch_split=config.batch_split, graded_oom=True, compiler_cache=compiler_cache)
        if fill == "staged":
            seeds.append(env.strategy(env.root()))
        report = _offset_progress(progress, searches, iterations, seconds)
        if config.search == "mcts":
            guided = fill in config.policy_fills
            searches.append(mcts_search(env, evaluator if guided else uniform_evaluator,
                                        batch_evaluator=batch_evaluator if guided else None,
                                        batch_size=batch_size if guided else 1,
                                        c_puct=config.c_puct, max_iterations=share,
                                        time_limit_s=None if seconds is None else seconds / len(fills),
                                        seed=config.seed, progress=report))
        else:
            searches.append(mcmc_search(env, max_iterations=share, time_limit_s=seconds, seed=config.seed,
                                        progress=report))
    search = _combine(searches)
    timings["search"] = search.search_time_s
    # The search scores placements without SFB and fusion; both are applied afterwards, to the search's
    # best and to the data-parallel baselines (DP-NCCL fused is Horovod), and the fastest finished plan is
    # kept. So a plan is never slower than DP-NCCL, DP-NCCL-P, Horovod or the search's best.
    starts = [(search.best, search.best_time if search.best_feasible else float("inf"), "search")]
    for name, baseline in zip(COMPARED_BASELINES[:2], baselines):  # DP-NCCL (fused: Horovod) and DP-NCCL-P
        if baseline.strategy is not None and baseline.strategy != search.best:
            starts.append((baseline.strategy, baseline.iteration_time_s if not baseline.oom else float("inf"), name))
    starts += [(seed, float("inf"), "staged") for seed in seeds if seed != search.best]
    finished, skipped = _finish(group_graph, starts, cluster, config, timings)
    _, strategy, selection, compiled, result, fusion, origin = finished
    return PlanOutcome(graph, group_graph, cluster, strategy, compiled, result, search, baselines, selection, timings,
                       fusion, origin, tuple(skipped))


def _finish(group_graph: GroupGraph, starts: list[tuple[Strategy, float, str]], cluster: Cluster,
            config: PlanConfig, timings: dict[str, float]) -> tuple[tuple, list[str]]:
    """The final pass over ``starts`` (strategy, its simulated time without SFB, origin): SFB where it helps
    and the deadline allows, then :func:`_final_plan`; the fastest finished plan and the origins the deadline
    left out (module docstring). Adds the "sfb" and "final" phases to ``timings``."""
    cache = SFBCache()
    finished = None
    skipped: list[str] = []
    sfb_s = final_s = 0.0
    for strategy, time_without, origin in starts:
        clock = time.perf_counter()
        late = config.deadline is not None and clock >= config.deadline
        if late and finished is not None and not (False, time_without) < finished[0]:
            skipped.append(origin)  # past the deadline, and no faster than what is finished without SFB
            continue
        selection, final_graph = None, group_graph
        if config.sfb and not late:
            selection = select_sfb(group_graph, strategy, cluster, cache=cache, granularity=config.granularity,
                                   time_without_s=time_without, deadline=config.deadline, reserve=FINAL_RESERVE)
            if selection.applied:
                final_graph = selection.plan.rewritten_group_graph()
        sfb_s += _lap(clock)
        clock = time.perf_counter()
        compiled, result, fusion = _final_plan(final_graph, strategy, cluster, config)
        final_s += _lap(clock)
        key = (not result.feasible, result.iteration_time)
        if finished is None or key < finished[0]:
            finished = (key, strategy, selection, compiled, result, fusion, origin)
    timings["sfb"], timings["final"] = sfb_s, final_s
    return finished, skipped

def _final_plan(group_graph: GroupGraph, strategy: Strategy, cluster: Cluster, config: PlanConfig
                ) -> tuple[CompiledPlan, SimulationResult, float | None]:
    """The strategy compiled with and without Horovod-style gradient fusion (an execution choice that does
    not change the placement, so the search leaves it out); the faster that fits is kept."""
    best = None
    for fusion in (None, DEFAULT_FUSION_BYTES) if config.fusion else (None,):
        compiled = compile_strategy(group_graph, strategy, cluster, granularity=config.granularity,
                                    fusion_bytes=fusion)
        result = compiled.simulate(feedback=True)
        key = (not result.feasible, result.iteration_time)
        if best is None or key < best[0]:
            best = (key, compiled, result, fusion)
    return best[1], best[2], best[3]


def _offset_progress(progress: ProgressCallback | None, done: list[SearchResult], iterations: int | None,
                     seconds: float | None) -> ProgressCallback | None:
    """Progress of the next search reported as progress of the whole run (after the searches ``done``)."""
    if progress is None:
        return None
    before = sum(r.num_iterations for r in done)
    simulations = sum(r.num_simulations for r in done)
    elapsed = sum(r.search_time_s for r in done)
    best = max((r.best_speedup for r in done), default=0.0)

    def report(p: SearchProgress) -> None:
        progress(p._replace(iteration=before + p.iteration, num_simulations=simulations + p.num_simulations,
                            elapsed_s=elapsed + p.elapsed_s, best_speedup=max(best, p.best_speedup),
                            max_iterations=iterations, time_limit_s=seconds))

    return report


def _combine(searches: list[SearchResult]) -> SearchResult:
    """One result for searches run one after another: the best plan of all (feasible first, then faster),
    budgets and times summed, iterations to beat the reference counted across them."""
    best = min(searches, key=lambda r: (not r.best_feasible, r.best_time))
    first_beat, done = None, 0
    for result in searches:
        if first_beat is None and result.first_beat_iteration is not None:
            first_beat = done + result.first_beat_iteration
        done += result.num_iterations
    return best._replace(
        num_iterations=done, num_simulations=sum(r.num_simulations for r in searches),
        search_time_s=sum(r.search_time_s for r in searches), first_beat_iteration=first_beat,
        targets=[t for r in searches for t in r.targets])


def _lap(start: float) -> float:
    return time.perf_counter() - start
