"""``tag plan --family all|data-parallel|pipeline|graph-pipeline``: parse → :func:`plan_fastest` → render.

``--family placement`` keeps ``tag plan``'s own path (:func:`tag.cli.cmd_plan`); the other families go
through :func:`run`, which prints one table of the plans each family found, the compute bound and the
chosen plan, writes the chosen plan's file with ``--out`` (a placement plan for the placement search and
the DP baselines, a pipeline plan for pipelines, one with partitioner "graphpipe" for graph pipelines:
the files ``tag simulate --strategy`` and ``tag run`` take) and returns the ``--json`` payload.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tag.planners.families import FAMILIES, Candidate
from tag.planners.fastest import FastestPlan, plan_fastest

__all__ = ["FAMILY_CHOICES", "families_of", "run"]

# what --family takes: one family, "graph" for graph-pipeline, or all of them
FAMILY_CHOICES = ("all", *FAMILIES, "graph")


def families_of(choice: str) -> tuple[str, ...]:
    """The families a ``--family`` value asks for."""
    if choice == "all":
        return FAMILIES
    return ("graph-pipeline",) if choice == "graph" else (choice,)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``tag plan`` over the families of ``args.family``."""
    from tag import cli
    from tag.cluster import resolve_cluster
    from tag.graph.resolve import resolve_model
    from tag.planner import PlanConfig, load_priors

    if args.out:
        cli._output_path(args.out, flag="--out", suffixes=(".json",), what="plan file")
    cli._check_view_paths(args)
    cluster = resolve_cluster(args.cluster)
    cost = cli._profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    families = families_of(args.family)
    priors = None
    if "placement" in families:
        priors = load_priors(None if args.uniform else (args.policy or cli._shipped_policy()))
    config = PlanConfig(num_groups=args.num_groups, max_iterations=args.budget, search=args.search,
                        sfb=not args.no_sfb, seed=args.seed)
    with cli._status(sys.stderr.isatty() and not args.json, f"planning {graph.meta.get('model', args.model)}"):
        found = plan_fastest(graph, cluster, families=families, time_limit_s=args.time, config=config,
                             priors=priors, cost=cost)
    payload = found.as_dict()
    if priors is not None:
        payload["priors"] = priors.label
    result, taskgraph = _simulation(found.best)
    if args.out:
        _save(args, found, payload)
    payload["files"] = {**({"plan": args.out} if args.out else {}),
                        **cli._write_views(args, result, taskgraph,
                                           f"{payload['model']} on {cluster.name}: tag plan ({found.best.family})")}
    if not args.json:
        _render(payload)
    return payload


def _simulation(best: Candidate):
    """(SimulationResult, TaskGraph) of the chosen plan, for --gantt and --trace."""
    plan = best.plan
    if best.family == "placement":
        return plan.result, plan.compiled.taskgraph
    if best.family == "data-parallel":
        return plan.compiled.simulate(feedback=False), plan.compiled.taskgraph
    return plan.result, plan.taskgraph


def _save(args: argparse.Namespace, found: FastestPlan, payload: dict) -> None:
    from tag import cli
    from tag.compiler import DEFAULT_FUSION_BYTES
    from tag.strategy import make_pipeline_plan, make_plan, save_pipeline_plan, save_plan

    best, graph, cluster = found.best, found.graph, found.cluster
    summary = {k: v for k, v in payload.items() if k not in ("families", "candidates")}
    if best.family == "placement":
        outcome = best.plan
        record = make_plan(outcome.strategy, graph, cluster, assignment=outcome.group_graph.assignment,
                           summary={**outcome.summary(), **summary})
        writer = save_plan
    elif best.family == "data-parallel":
        group_graph = best.info["group_graph"]
        fusion = DEFAULT_FUSION_BYTES if best.planner == "Horovod" else None
        record = make_plan(best.plan.strategy, graph, cluster, assignment=group_graph.assignment,
                           summary={**summary, "fusion_bytes": fusion, "sfb_groups": []})
        writer = save_plan
    else:
        plan = best.plan
        sg = plan.stage_graph
        record = make_pipeline_plan(graph, cluster, partitioner=plan.partitioner, schedule=plan.schedule,
                                    micro_batches=sg.micro_batches, replicas=sg.replicas.tolist(),
                                    reference_gpu=sg.gpu_types[sg.reference_type].name,
                                    forward_assignment=sg.forward_assignment, mapping=plan.mapping,
                                    summary=summary, links=sg.info.get("links", "data"))
        writer = save_pipeline_plan
    try:
        writer(record, cli._staged(args, args.out))
    except OSError as error:
        raise cli.OutputError(f"--out {args.out!r}: {error.strerror or error}") from None


_SHORT = {"data-parallel": "DP", "graph-pipeline": "graph"}  # family names in the 80-column table


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 0.1 else f"{value * 1e3:.0f} ms"


def _iteration(value: float) -> str:
    """Four significant digits, so that the table fits 80 columns."""
    if value >= 10:
        return f"{value:.1f} s"
    return f"{value * 1e3:.4g} ms" if value >= 1e-3 else f"{value * 1e6:.4g} us"


def _render(payload: dict) -> None:
    from rich import box
    from rich.table import Table

    from tag import cli
    from tag.units import format_bytes, format_time

    payload = cli._shown(payload)
    table = Table(title=f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                        f"({payload['devices']} devices)", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("family", "planner", "plan", "iteration", "x bound", "peak", "planned"):
        table.add_column(column, justify="left" if column in ("family", "planner", "plan") else "right",
                         no_wrap=column != "plan")
    chosen = (payload["family"], payload["planner"])
    for row in payload["candidates"]:
        family = _SHORT.get(row["family"], row["family"])
        if row["iteration_time_s"] is None:
            table.add_row(family, row["planner"], f"[dim]{row['note'][:60]}[/]", "-", "-", "-",
                          _seconds(row["planning_time_s"]))
            continue
        mark = (row["family"], row["planner"]) == chosen
        oom = "" if row["feasible"] else " [red]OOM[/]"
        table.add_row(family, f"[bold green]{row['planner']}[/]" if mark else row["planner"], row["shape"],
                      _iteration(row["iteration_time_s"]) + oom, f"{row['bound_ratio']:.2f}",
                      format_bytes(row["peak_memory_bytes"]), _seconds(row["planning_time_s"]))
    console = cli._console()
    console.print(table)
    console.print(f"compute bound {format_time(payload['compute_bound_s'])}: one iteration's work over the "
                  "devices' summed speed")
    state = "fits" if payload["feasible"] else "[red]OOM[/]"
    console.print(f"chosen: {payload['family']}, {payload['planner']} ({payload['shape']}): "
                  f"{format_time(payload['iteration_time_s'])}, {payload['bound_ratio']:.2f}x the bound, {state}")
    console.print(f"planned in {_seconds(payload['planning_time_s'])}")
    for kind, path in payload["files"].items():
        console.print(f"wrote {kind}: {path}")
