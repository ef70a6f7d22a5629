"""The `tag` command.

Every command that reports results takes ``--json``; bad input ends in one ``tag: error: ...`` line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from tag._atomic import staged_outputs
from tag.errors import OutputError, TagError

__all__ = ["main", "build_parser"]

EXIT_BAD_INPUT = 2


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _shown(value: Any) -> Any:
    """``value`` with every string escaped for rich markup, so that names from the user's files (a cluster
    called "[/]") print as written; the printers add their own markup around them."""
    from rich.markup import escape

    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {key: _shown(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shown(item) for item in value]
    return value


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _print_json(payload: Any) -> None:
    text = json.dumps(_finite(payload), separators=(", ", ": "), default=float, allow_nan=False)
    sys.stdout.write(text + "\n")


def _output_path(text: str, *, flag: str = "--out", suffixes: tuple[str, ...] = (".json", ".json.gz"),
                 what: str = "graph file") -> Path:
    """Checked before any long work: a file name with one of ``suffixes`` whose folder exists or can be made."""
    path = Path(text)
    expected = " or ".join(suffixes)
    try:
        if not text or path.is_dir():
            raise OutputError(f"{flag} {text!r}: expected a file name ending in {expected}")
        if not text.lower().endswith(suffixes):
            raise OutputError(f"{flag} {text!r}: the {what} name must end in {expected}")
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
                    raise OutputError(f"{flag} {text!r}: cannot write into {str(parent)!r}")
                break
    except (OSError, ValueError) as error:  # a folder name the OS refuses (too long), a NUL
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise OutputError(f"{flag} {text[:80]!r}{'…' if len(text) > 80 else ''}: {reason}") from None
    return path


def _int_in(low: int, high: int, shown: str):
    """An argparse type: an integer in low..high (``shown`` says the range in messages)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {shown}, got {value}")
        return value

    return parse


_batch_size = _int_in(1, 2**31, "1..2^31")
_positive_int = _int_in(1, 10**9, "1..10^9")
_num_groups = _int_in(1, 10_000, "1..10000")
_micro_batches = _int_in(1, 4096, "1..4096")  # tag.exact.stage_graph.MAX_MICRO_BATCHES
_seed = _int_in(0, 2**63 - 1, "0..2^63-1")  # tag._rng.MAX_SEED: METIS and torch take a signed 64-bit seed


def _named(text: str) -> str:
    """An argparse type for a file or preset name: an empty one is an error, not the flag left out."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


# ---------------------------------------------------------------------------------------------- models
def cmd_models(args: argparse.Namespace) -> dict:
    from tag.models import list_models

    rows = []
    for spec in list_models():
        rows.append(
            {
                "name": spec.name,
                "description": spec.description,
                "batch_size": spec.batch_size,
                "paper_parameters": spec.paper_parameters,
                "paper_source": spec.paper_source,
            }
        )
    if args.json:
        return {"models": rows}
    from rich.table import Table

    table = Table(title="Model zoo (tag.models)")
    for column in ("name", "batch", "paper params", "source", "description"):
        table.add_column(column)
    for row in rows:
        params = f"{row['paper_parameters'] / 1e6:.1f}M" if row["paper_parameters"] else "-"
        table.add_row(row["name"], str(row["batch_size"]), params, row["paper_source"], row["description"])
    _console().print(table)
    return {"models": rows}


# -------------------------------------------------------------------------------------------- clusters
def cmd_clusters(args: argparse.Namespace) -> dict:
    from tag.cluster import list_presets

    rows = list_presets()
    if args.json:
        return {"clusters": rows}
    from rich.table import Table

    table = Table(title="Cluster presets (--cluster NAME[:ARGS] or a YAML/JSON spec file)")
    for column in ("name", "example", "devices", "description"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row.get("address", row["name"]), str(row["devices"]), row.get("description", ""))
    _console().print(table)
    return {"clusters": rows}


# ------------------------------------------------------------------------------------------------ show
def _model_summary(graph) -> dict:
    from tag.cost import training_memory_bytes

    return {
        "model": graph.meta.get("model", ""),
        "source": graph.meta.get("source", ""),
        "batch_size": graph.batch_size,
        "parameters": graph.parameters,
        "parameter_bytes": graph.total_param_bytes(),
        "ops": {role: n for role, n in graph.count_by_role().items()},
        "edges": graph.num_edges,
        "flops_per_iteration": graph.total_flops(),
        "training_memory_bytes": float(training_memory_bytes(graph)),
    }


def _fit_rows(graph, cluster, memory_bytes: float, cost=None) -> list[dict]:
    import numpy as np

    from tag.cost import CostModel

    cost = CostModel() if cost is None else cost
    rows = []
    for t, gpu in enumerate(cluster.types):
        count = int(np.sum(cluster.device_type == t))
        rows.append(
            {
                "gpu": gpu.name,
                "count": count,
                "memory_bytes": gpu.memory_bytes,
                "fits": bool(memory_bytes <= gpu.memory_bytes),
                "single_device_iteration_s": float(cost.op_times(graph, gpu).sum()),
            }
        )
    return rows


def cmd_show(args: argparse.Namespace) -> dict:
    from tag.graph.resolve import resolve_model
    from tag.units import format_bytes, format_time

    cluster = None
    if args.cluster:  # resolved first: it is cheap and a bad one should fail before a long trace
        from tag.cluster import resolve_cluster

        cluster = resolve_cluster(args.cluster)
    cost = _profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    payload = _model_summary(graph)
    if cluster is not None:
        payload["cluster"] = {"name": cluster.name, "devices": cluster.num_devices}
        payload["fits_on"] = _fit_rows(graph, cluster, payload["training_memory_bytes"], cost)
    if args.json:
        return payload
    from rich.table import Table

    console = _console()
    payload = _shown(payload)  # printed from here on; --json returned above
    table = Table(title=f"{payload['model']} (batch {payload['batch_size']}, from {payload['source']})", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("parameters", f"{payload['parameters']:,} ({format_bytes(payload['parameter_bytes'])})")
    for role, n in payload["ops"].items():
        table.add_row(f"{role} ops", f"{n:,}")
    table.add_row("edges", f"{payload['edges']:,}")
    table.add_row("FLOPs per iteration", f"{payload['flops_per_iteration']:.3e}")
    table.add_row("training memory (Adam)", format_bytes(payload["training_memory_bytes"]))
    console.print(table)
    if cluster is not None:
        fit = Table(title=f"Fit on {payload['cluster']['name']} ({cluster.num_devices} devices)")
        for column in ("GPU", "count", "memory", "fits whole model", "one-device iteration"):
            fit.add_column(column)
        for row in payload["fits_on"]:
            fit.add_row(
                row["gpu"], str(row["count"]), format_bytes(row["memory_bytes"]),
                "[green]yes[/]" if row["fits"] else "[red]no[/]", format_time(row["single_device_iteration_s"]),
            )
        console.print(fit)
    return payload


# ----------------------------------------------------------------------------------------------- trace
def cmd_trace(args: argparse.Namespace) -> dict:
    from tag.graph.io import save_graph
    from tag.graph.resolve import resolve_model

    out = _output_path(args.out)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    try:
        save_graph(graph, _staged(args, str(out)))
    except OSError as error:
        raise OutputError(f"--out {args.out!r}: {error.strerror or error}") from None
    payload = {"out": str(args.out), **_model_summary(graph)}
    if not args.json:
        roles = ", ".join(f"{n} {role}" for role, n in payload["ops"].items())
        _console().print(f"wrote {_shown(args.out)}: {graph.num_ops} ops ({roles}), {graph.num_edges} edges, {graph.parameters:,} parameters")
    return payload


# -------------------------------------------------------------------------------------- simulate
def _write_views(args: argparse.Namespace, result, taskgraph, title: str) -> dict:
    """The Chrome trace and Gantt chart asked for by --trace / --gantt; returns the paths written."""
    from tag.sim.trace import gantt, to_chrome_trace

    written = {}
    for flag, kind, write in (("--trace", "trace", lambda path: to_chrome_trace(result, taskgraph, path)),
                              ("--gantt", "gantt", lambda path: gantt(result, taskgraph, path, title=title))):
        path = getattr(args, kind, None)
        if path:
            try:
                write(_staged(args, path))
            except OSError as error:
                raise OutputError(f"{flag} {path!r}: {error.strerror or error}") from None
            written[kind] = path
    return written


def _staged(args: argparse.Namespace, path: str) -> str:
    """Where to write the output file ``path``: a staged name that `main` renames over it once the whole
    command succeeded (all of a command's outputs land or none), or ``path`` itself outside `main`."""
    stage = getattr(args, "stage", None)
    return str(stage(path)) if stage is not None else path


def _check_view_paths(args: argparse.Namespace) -> None:
    if getattr(args, "trace", None):
        _output_path(args.trace, flag="--trace", suffixes=(".json",), what="Chrome trace")
    if getattr(args, "gantt", None):
        _output_path(args.gantt, flag="--gantt", suffixes=(".png",), what="Gantt chart")


def _plan_group_graph(plan, graph, cluster, args: argparse.Namespace):
    """The grouping a plan file was made with: its stored assignment, or METIS with the plan's group count
    (checked against the plan's grouping fingerprint when it has one)."""
    from tag.grouping import GroupGraph, group_ops
    from tag.strategy.errors import PlanMismatchError
    from tag.strategy.fingerprint import grouping_fingerprint

    if plan.assignment is not None:
        return GroupGraph.from_assignment(graph, plan.assignment, gpus=cluster)
    group_graph = group_ops(graph, num_groups=plan.strategy.num_groups, gpus=cluster, seed=args.seed)
    if group_graph.num_groups != plan.strategy.num_groups:
        raise PlanMismatchError(f"{args.strategy}: METIS gives {group_graph.num_groups} groups for this model, "
                                f"the plan has {plan.strategy.num_groups} rows and no stored grouping")
    if plan.grouping_fingerprint and grouping_fingerprint(group_graph.assignment) != plan.grouping_fingerprint:
        raise PlanMismatchError(f"{args.strategy}: the plan's grouping is not stored and METIS (seed {args.seed}) "
                                "groups this model differently")
    return group_graph


def _simulation_payload(result, taskgraph, cluster, batch_size: int) -> dict:
    capacity = cluster.memory_bytes()
    return {
        "iteration_time_s": float(result.iteration_time),
        "samples_per_s": batch_size / result.iteration_time if result.iteration_time > 0 else None,
        "feasible": bool(result.feasible),
        "oom": not result.feasible,
        "oom_device": int(result.oom_device) if result.oom_device >= 0 else None,
        "peak_memory_bytes": [float(x) for x in result.peak_memory],
        "memory_capacity_bytes": [float(x) for x in capacity],
        "tasks": int(taskgraph.num_tasks),
    }


def _plan_kind(path: str) -> str | None:
    from tag.strategy import plan_kind

    return plan_kind(path)


def _simulate_pipeline_plan(args: argparse.Namespace, graph, cluster) -> dict:
    """`tag simulate --strategy` of a pipeline plan file (kind "pipeline", from `tag pipeline --out`)."""
    from tag.exact import replay_pipeline
    from tag.strategy import load_pipeline_plan
    from tag.units import format_time

    record = load_pipeline_plan(args.strategy, graph=graph, cluster=cluster)
    if record.partitioner == "graphpipe":  # its stages run GraphPipe's static orders over the stage DAG
        from tag.graphpipe import replay_graph_pipeline

        plan = replay_graph_pipeline(graph, cluster, forward_assignment=record.forward_assignment,
                                     replicas=record.replicas, micro_batches=record.micro_batches,
                                     mapping=record.mapping, reference_gpu=record.reference_gpu, links=record.links,
                                     cost=_profile_cost(args))
    else:
        plan = replay_pipeline(graph, cluster, forward_assignment=record.forward_assignment, replicas=record.replicas,
                               micro_batches=record.micro_batches, mapping=record.mapping, schedule=record.schedule,
                               reference_gpu=record.reference_gpu, partitioner=record.partitioner, links=record.links,
                               cost=_profile_cost(args))
    label = f"pipeline plan {args.strategy}"
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "what": label,
               "kind": "pipeline", "stages": plan.num_stages, "replicas": list(record.replicas),
               "micro_batches": record.micro_batches, "schedule": record.schedule,
               "mapping": [list(row) for row in record.mapping], "max_stage_time_s": plan.max_stage_time,
               **_simulation_payload(plan.result, plan.taskgraph, cluster, graph.batch_size)}
    payload["files"] = _write_views(args, plan.result, plan.taskgraph, f"{payload['model']} on {cluster.name}: {label}")
    if args.json:
        return payload
    state = "[green]fits[/]" if plan.result.feasible else f"[red]OOM on device {plan.result.oom_device}[/]"
    console = _console()
    payload = _shown(payload)  # printed from here on; --json returned above
    console.print(f"{payload['model']} on {payload['cluster']}, {payload['what']}: {plan.num_stages} stages x "
                  f"{list(record.replicas)} "
                  f"replicas, {record.micro_batches} micro-batches ({record.schedule}): iteration "
                  f"{format_time(plan.iteration_time)}, {payload['samples_per_s']:.1f} samples/s, {state} "
                  f"({payload['tasks']:,} tasks)")
    for kind, path in payload["files"].items():
        console.print(f"wrote {kind}: {path}")
    return payload


def cmd_simulate(args: argparse.Namespace) -> dict:
    from tag.cluster import resolve_cluster
    from tag.graph.resolve import resolve_model
    from tag.units import format_bytes, format_time

    if (args.strategy is None) == (args.baseline is None):
        raise OutputError("give exactly one of --strategy PLAN.json and --baseline NAME")
    _check_view_paths(args)
    cluster = resolve_cluster(args.cluster)
    cost = _profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    if args.strategy is not None and _plan_kind(args.strategy) == "pipeline":
        return _simulate_pipeline_plan(args, graph, cluster)
    if args.strategy is not None:
        from tag.compiler import compile_strategy
        from tag.strategy import load_plan

        plan = load_plan(args.strategy, graph=graph, cluster=cluster)
        group_graph = _plan_group_graph(plan, graph, cluster, args)
        sfb_groups = plan.summary.get("sfb_groups") or []
        if sfb_groups:  # the SFB `tag plan` kept: the program is deterministic, so re-apply it
            from tag.sfb import apply_sfb

            group_graph = apply_sfb(group_graph, plan.strategy, cluster).restricted(sfb_groups).rewritten_group_graph()
        compiled = compile_strategy(group_graph, plan.strategy, cluster, granularity=args.granularity,
                                    fusion_bytes=plan.summary.get("fusion_bytes"), cost=cost)
        plan_cluster, label = cluster, f"plan {args.strategy}"
    else:
        from tag.baselines import BASELINES
        from tag.grouping import group_ops

        group_graph = group_ops(graph, num_groups=args.num_groups, gpus=cluster, seed=args.seed, cost=cost)
        baseline = BASELINES[args.baseline](group_graph, cluster, granularity=args.granularity)
        compiled, plan_cluster, label = baseline.compiled, baseline.plan_cluster, baseline.name
    result = compiled.simulate(feedback=False)
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "what": label,
               "granularity": args.granularity, "num_groups": group_graph.num_groups,
               **_simulation_payload(result, compiled.taskgraph, plan_cluster, graph.batch_size)}
    if plan_cluster is not cluster:
        payload["devices_used"] = plan_cluster.name
    payload["files"] = _write_views(args, result, compiled.taskgraph,
                                    f"{payload['model']} on {cluster.name}: {label}")
    if args.json:
        return payload
    from rich.table import Table

    console = _console()
    payload = _shown(payload)  # printed from here on; --json returned above
    state = "[green]fits[/]" if result.feasible else f"[red]OOM on device {result.oom_device}[/]"
    console.print(f"{payload['model']} on {payload['cluster']}, {payload['what']}: "
                  f"iteration {format_time(result.iteration_time)}, "
                  f"{payload['samples_per_s']:.1f} samples/s, {state} ({payload['tasks']:,} tasks)")
    table = Table(title="Peak memory per device")
    for column in ("device", "GPU", "peak", "capacity", "use"):
        table.add_column(column, justify="right")
    for d, (peak, cap) in enumerate(zip(payload["peak_memory_bytes"], payload["memory_capacity_bytes"])):
        share = peak / cap if cap else 0.0
        colour = "red" if share > 1 else "default"
        table.add_row(str(d), _shown(plan_cluster.gpu(d).name), format_bytes(peak), format_bytes(cap),
                      f"[{colour}]{share:.0%}[/]")
    console.print(table)
    for kind, path in payload["files"].items():
        console.print(f"wrote {kind}: {path}")
    return payload


# ------------------------------------------------------------------------------------- baselines
def cmd_baselines(args: argparse.Namespace) -> dict:
    from tag.baselines import BASELINES, baselines_table, run_baselines
    from tag.cluster import resolve_cluster
    from tag.graph.resolve import resolve_model
    from tag.units import format_bytes, format_time

    names = tuple(args.only.split(",")) if args.only else tuple(BASELINES)
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise OutputError(f"--only: unknown baseline {unknown[0]!r}; expected some of {', '.join(BASELINES)}")
    cluster = resolve_cluster(args.cluster)
    cost = _profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    results = run_baselines(graph, cluster, num_groups=args.num_groups, names=names, seed=args.seed,
                            granularity=args.granularity, cost=cost)
    rows = []
    for key, result, row in zip(names, results, baselines_table(results)):
        rows.append({**row, "baseline": key, "feasible": not result.oom,
                     "peak_memory_bytes": [float(x) for x in result.peak_memory]})
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "devices": cluster.num_devices,
               "batch_size": graph.batch_size, "num_groups": args.num_groups, "baselines": rows}
    if args.json:
        return payload
    from rich.table import Table

    payload = _shown(payload)  # printed from here on; --json returned above
    rows = payload["baselines"]
    table = Table(title=f"Baselines: {payload['model']} (batch {graph.batch_size}) on {payload['cluster']} "
                        f"({cluster.num_devices} devices)")
    for column in ("baseline", "iteration", "samples/s", "vs DP-NCCL", "max peak memory", "fits", "note"):
        table.add_column(column, justify="left" if column in ("baseline", "note") else "right")
    for row in rows:
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        fits = "[green]yes[/]" if row["feasible"] else f"[red]OOM (device {row['oom_device']})[/]"
        table.add_row(row["name"], format_time(row["iteration_time_s"]), f"{row['samples_per_s']:.1f}", speedup,
                      format_bytes(row["max_peak_memory_bytes"]), fits, row["note"])
    _console().print(table)
    return payload


# ------------------------------------------------------------------------------------------------ plan
def _search_progress(enabled: bool):
    """A rich progress bar on stderr with the best speed-up so far; a no-op context when disabled."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)


def _progress_callback(bar, description: str):
    """The search's progress hook drawing on ``bar`` (None: no hook)."""
    if bar is None:
        return None
    task = bar.add_task(_shown(description), total=1.0, status="")

    def callback(p) -> None:
        best = f"best {p.best_speedup:.3f}x" if p.best_speedup > 0 else "no feasible plan yet"
        bar.update(task, completed=p.fraction(), status=f"{p.iteration} it, {p.num_simulations} sims, {best}")

    return callback


def _shipped_policy() -> str:
    from tag.policy import shipped_policy_path

    return str(shipped_policy_path())


def cmd_plan(args: argparse.Namespace) -> dict:
    from tag.cluster import resolve_cluster
    from tag.graph.resolve import resolve_model
    from tag.planner import PlanConfig, load_priors, plan_training
    from tag.strategy import make_plan, save_plan

    if args.family != "placement":  # every family, or another one: the planners layer
        from tag.planners import cli as planners_cli

        return planners_cli.run(args)
    if args.out:
        _output_path(args.out, flag="--out", suffixes=(".json",), what="plan file")
    _check_view_paths(args)
    cluster = resolve_cluster(args.cluster)
    cost = _profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    if args.uniform:
        checkpoint = None
    else:
        checkpoint = args.policy or _shipped_policy()
    evaluator, batch_evaluator, priors = load_priors(checkpoint)
    config = PlanConfig(num_groups=args.num_groups, max_iterations=args.budget, time_limit_s=args.time,
                        search=args.search, sfb=not args.no_sfb, seed=args.seed)
    with _search_progress(sys.stderr.isatty()) as bar:
        callback = _progress_callback(bar, f"{args.search} on {graph.meta.get('model', args.model)}")
        outcome = plan_training(graph, cluster, config=config, evaluator=evaluator, batch_evaluator=batch_evaluator,
                                batch_size=8 if batch_evaluator is not None else 1, progress=callback, cost=cost)
    payload = {**outcome.summary(), "priors": priors}
    payload["groups"] = outcome.group_rows()
    from tag.planners import compute_bound

    payload["compute_bound_s"] = compute_bound(graph, cluster, cost=cost)
    payload["bound_ratio"] = outcome.result.iteration_time / payload["compute_bound_s"]
    if args.out:
        plan = make_plan(outcome.strategy, graph, cluster, assignment=outcome.group_graph.assignment,
                         summary={k: v for k, v in payload.items() if k != "groups"})
        try:
            save_plan(plan, _staged(args, args.out))
        except OSError as error:
            raise OutputError(f"--out {args.out!r}: {error.strerror or error}") from None
    files = _write_views(args, outcome.result, outcome.compiled.taskgraph,
                         f"{payload['model']} on {cluster.name}: tag plan")
    payload["files"] = {**({"plan": args.out} if args.out else {}), **files}
    if not args.json:
        _print_plan(payload, cluster)
    return payload


def _print_plan(payload: dict, cluster) -> None:
    from rich.table import Table

    from tag.units import format_bytes, format_time

    payload = _shown(payload)  # names from the user's files print as written

    console = _console()
    groups = Table(title=f"Plan per op group ({payload['num_groups']} groups, most compute first)")
    for column in ("group", "ops", "device groups", "devices", "option", "compute", "makespan", "params", "SFB"):
        groups.add_column(column, justify="right" if column not in ("device groups", "option") else "left")
    for row in payload["groups"]:
        devices = row["devices"]
        shown = ",".join(map(str, devices)) if len(devices) <= 6 else f"{len(devices)} devices"
        groups.add_row(str(row["group"]), str(row["ops"]), ",".join(map(str, row["device_groups"])), shown,
                       row["option"], format_time(row["compute_s"]),
                       format_time(row["makespan_s"]) if row["makespan_s"] is not None else "-",
                       format_bytes(row["param_bytes"]), "yes" if row["sfb"] else "")
    console.print(groups)
    summary = Table(title=f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                          f"({payload['devices']} devices)", show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    state = "[green]fits[/]" if payload["feasible"] else f"[red]OOM on device {payload['oom_device']}[/]"
    summary.add_row("iteration time", f"{format_time(payload['iteration_time_s'])} ({state})")
    summary.add_row("samples/s", f"{payload['samples_per_s']:.1f}" if payload["samples_per_s"] else "-")
    summary.add_row("compute bound", f"{format_time(payload['compute_bound_s'])} ({payload['bound_ratio']:.2f}x)")
    for baseline in payload["baselines"]:
        ratio = payload["speedup_over"][baseline["name"]]
        oom = " (baseline OOM)" if baseline["oom"] else ""
        summary.add_row(f"speed-up over {baseline['name']}",
                        (f"{ratio:.3f}x" if ratio else "-") + f"  [{format_time(baseline['iteration_time_s'])}{oom}]")
    summary.add_row("search", f"{payload['search']}, {payload['priors']}: {payload['iterations']} iterations, "
                              f"{payload['simulations']} simulations, {format_time(payload['search_time_s'])}")
    if payload["sfb"] is not None:
        sfb = payload["sfb"]
        summary.add_row("SFB", f"{sfb['groups_kept']} groups, {sfb['gradients_replaced']} gradients, "
                               f"{sfb['ops_duplicated']} ops duplicated, saves "
                               f"{format_time(sfb['simulated_time_saved_s'])} (simulated)")
    peaks = payload["peak_memory_bytes"]
    capacity = payload["memory_capacity_bytes"]
    for m in range(cluster.num_device_groups):
        members = [d for d in range(cluster.num_devices) if cluster.device_group[d] == m]
        worst = max(members, key=lambda d: peaks[d] / capacity[d])
        summary.add_row(f"peak memory, device group {m} ({_shown(cluster.gpu(worst).name)} x{len(members)})",
                        f"{format_bytes(peaks[worst])} of {format_bytes(capacity[worst])}")
    console.print(summary)
    for kind, path in payload["files"].items():
        console.print(f"wrote {kind}: {path}")


# -------------------------------------------------------------------------------------------- pipeline
def cmd_pipeline(args: argparse.Namespace) -> dict:
    import numpy as np

    from tag.cluster import resolve_cluster
    from tag.exact import make_mapper, mapped_stage_times, plan_pipeline
    from tag.graph.resolve import resolve_model

    if args.partitioner == "graphpipe" and (args.stages or args.replicas or args.links != "data"):
        raise OutputError("--partitioner graphpipe chooses its own stages, replicas and stage edges: leave out "
                          "--stages, --replicas and --links")
    if args.out:
        _output_path(args.out, flag="--out", suffixes=(".json",), what="plan file")
    _check_view_paths(args)
    cluster = resolve_cluster(args.cluster)
    cost = _profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    if args.partitioner == "graphpipe":
        return _graph_pipeline(args, graph, cluster)
    mapper = make_mapper(args.mapper, time_limit=args.time_limit, policy=args.mapper_policy)
    with _status(sys.stderr.isatty() and not args.json, f"planning a pipeline of {graph.meta.get('model', args.model)}"):
        options = dict(stages=args.stages, replicas=args.replicas, auto=args.auto, mapper=mapper,
                       micro_batches=args.micro_batches, schedule=args.schedule, seed=args.seed, links=args.links,
                       cost=cost)
        if args.partitioner == "best":  # every sequential partitioner, the fastest plan (the planners layer)
            from tag.planners import fastest_pipeline

            plan = fastest_pipeline(graph, cluster, **options)
        else:
            plan = plan_pipeline(graph, cluster, partitioner=args.partitioner, **options)
    sg = plan.stage_graph
    per_stage, _ = mapped_stage_times(sg, cluster, plan.mapping, plan.instantiation)
    ops = np.bincount(sg.assignment if sg.assignment.size else sg.forward_assignment, minlength=sg.num_stages)
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "devices": cluster.num_devices,
               "batch_size": graph.batch_size, "mapper": args.mapper, **plan.as_dict()}
    payload["samples_per_s"] = graph.batch_size / plan.iteration_time if plan.iteration_time > 0 else None
    payload["stage_rows"] = [
        {"stage": s, "ops": int(ops[s]), "compute_per_micro_batch_s": float(sg.stage_time[s]),
         "time_per_iteration_s": None if per_stage is None else float(per_stage[s]),
         "param_bytes": float(sg.param_bytes[s]), "devices": plan.mapping[s]}
        for s in range(sg.num_stages)]
    if args.out:
        _save_pipeline_plan(args, plan, graph, cluster, payload)
    files = _write_views(args, plan.result, plan.taskgraph,
                         f"{payload['model']} on {cluster.name}: pipeline {sg.num_stages} stages")
    payload["files"] = {**({"plan": args.out} if args.out else {}), **files}
    if not args.json:
        _print_pipeline(payload)
    return payload


def _graph_pipeline(args: argparse.Namespace, graph, cluster) -> dict:
    """`tag pipeline --partitioner graphpipe`: GraphPipe's series-parallel stage graph and its schedule."""
    from tag.graphpipe import plan_graph_pipeline
    from tag.units import format_bytes, format_time

    with _status(sys.stderr.isatty() and not args.json, f"planning a graph pipeline of {graph.meta.get('model', args.model)}"):
        plan = plan_graph_pipeline(graph, cluster, micro_batches=args.micro_batches, cost=_profile_cost(args))
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "devices": cluster.num_devices,
               "batch_size": graph.batch_size, **plan.as_dict()}
    payload["samples_per_s"] = graph.batch_size / plan.iteration_time if plan.iteration_time > 0 else None
    if args.out:
        _save_pipeline_plan(args, plan, graph, cluster, payload)
    payload["files"] = {**({"plan": args.out} if args.out else {}),
                        **_write_views(args, plan.result, plan.taskgraph,
                                       f"{payload['model']} on {cluster.name}: graph pipeline {plan.num_stages} stages")}
    if args.json:
        return payload
    from rich.table import Table

    payload = _shown(payload)  # printed from here on; --json returned above
    table = Table(title=f"Graph pipeline (GraphPipe): {payload['model']} (batch {graph.batch_size}) on {payload['cluster']}, "
                        f"{payload['micro_batches']} micro-batches, depth {payload['depth']}")
    for column in ("stage", "ops", "compute / micro-batch", "in flight", "devices", "feeds"):
        table.add_column(column, justify="left" if column in ("devices", "feeds") else "right")
    for s, devices in enumerate(payload["mapping"]):
        feeds = ",".join(str(b) for a, b in payload["stage_edges"] if a == s) or "-"
        table.add_row(str(s), f"{payload['stage_ops'][s]:,}", format_time(payload["stage_time_s"][s]),
                      str(payload["inflight"][s]), ",".join(map(str, devices)), feeds)
    console = _console()
    console.print(table)
    state = "[green]fits[/]" if payload["feasible"] else "[red]OOM[/]"
    console.print(f"iteration {format_time(payload['iteration_time_s'])} ({state}), "
                  f"{payload['samples_per_s']:.1f} samples/s, peak memory {format_bytes(payload['peak_memory_bytes'])}, "
                  f"search {format_time(payload['solve_time_s'])}")
    for kind, path in payload["files"].items():
        console.print(f"wrote {kind}: {path}")
    return payload


def _status(enabled: bool, message: str):
    """A spinner on stderr while a long step runs; a no-op context when disabled."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext(None)
    from rich.console import Console

    return Console(stderr=True).status(_shown(message))


def _save_pipeline_plan(args: argparse.Namespace, plan, graph, cluster, payload: dict) -> None:
    from tag.strategy import make_pipeline_plan, save_pipeline_plan

    sg = plan.stage_graph
    summary = {k: v for k, v in payload.items() if k not in ("stage_rows", "mapping", "files")}
    record = make_pipeline_plan(graph, cluster, partitioner=plan.partitioner, schedule=plan.schedule,
                                micro_batches=sg.micro_batches, replicas=sg.replicas.tolist(),
                                reference_gpu=sg.gpu_types[sg.reference_type].name,
                                forward_assignment=sg.forward_assignment, mapping=plan.mapping, summary=summary,
                                links=sg.info.get("links", "data"))
    try:
        save_pipeline_plan(record, _staged(args, args.out))
    except OSError as error:
        raise OutputError(f"--out {args.out!r}: {error.strerror or error}") from None


def _print_pipeline(payload: dict) -> None:
    from rich.table import Table

    from tag.units import format_bytes, format_time

    payload = _shown(payload)  # names from the user's files print as written

    console = _console()
    stages = Table(title=f"Pipeline stages ({payload['partitioner']}, {payload['micro_batches']} micro-batches, "
                         f"{payload['schedule']})")
    for column in ("stage", "ops", "compute / micro-batch", "stage time / iteration", "params", "devices"):
        stages.add_column(column, justify="left" if column == "devices" else "right")
    bottleneck = payload["max_stage_time_s"]
    for row in payload["stage_rows"]:
        devices = row["devices"]
        shown = ",".join(map(str, devices)) if len(devices) <= 8 else f"{devices[0]}…{devices[-1]} ({len(devices)})"
        per_iteration = row["time_per_iteration_s"]
        text = "-" if per_iteration is None else format_time(per_iteration)
        if per_iteration is not None and per_iteration == bottleneck:
            text = f"[bold]{text}[/]"
        stages.add_row(str(row["stage"]), f"{row['ops']:,}", format_time(row["compute_per_micro_batch_s"]), text,
                       format_bytes(row["param_bytes"]), shown)
    console.print(stages)
    summary = Table(title=f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                          f"({payload['devices']} devices)", show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    replicas = payload["replicas"]
    summary.add_row("stages x replicas", f"{payload['stages']} x {replicas}")
    state = "[green]fits[/]" if payload["feasible"] else "[red]OOM[/]"
    summary.add_row("iteration time (simulated)", f"{format_time(payload['iteration_time_s'])} ({state})")
    summary.add_row("samples/s", f"{payload['samples_per_s']:.1f}" if payload["samples_per_s"] else "-")
    kind = f" ({payload['instantiation']})" if payload.get("instantiation") else ""
    summary.add_row(f"max stage time / iteration{kind}", format_time(bottleneck))
    if payload["lower_bound_s"] is not None:
        proof = "[green]proven optimal[/]" if payload["proven_optimal"] else f"gap {100 * (payload['gap'] or 0):.1f}%"
        summary.add_row("lower bound", f"{format_time(payload['lower_bound_s'])} ({proof})")
    summary.add_row(f"mapper ({payload['mapper']})", format_time(payload["solve_time_s"]))
    summary.add_row("peak memory (max device)", format_bytes(payload["peak_memory_bytes"]))
    if payload.get("mapper_skipped"):
        summary.add_row("mapper skipped", payload["mapper_skipped"])
    console.print(summary)
    for kind, path in payload["files"].items():
        console.print(f"wrote {kind}: {path}")


# --------------------------------------------------------------------------------------------- compare
def cmd_compare(args: argparse.Namespace) -> dict:
    from tag.cluster import resolve_cluster
    from tag.compare import CompareConfig, compare_planners
    from tag.graph.resolve import resolve_model

    cluster = resolve_cluster(args.cluster)
    cost = _profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    config = CompareConfig(budget=args.budget, num_groups=args.num_groups, policy=args.policy,
                           mapping_time_limit=args.time_limit, graphpipe=not args.no_graphpipe, seed=args.seed,
                           mapper_policy=args.mapper_policy)
    with _status(sys.stderr.isatty() and not args.json, "comparing planners") as status:
        report = (lambda message: status.update(f"comparing planners: {message}")) if status is not None else None
        rows = compare_planners(graph, cluster, config=config, progress=report, cost=cost)
    payload = {"model": graph.meta.get("model", args.model), "cluster": cluster.name, "devices": cluster.num_devices,
               "batch_size": graph.batch_size, "budget": args.budget, "policy": config.policy or _shipped_policy(),
               "planners": rows}
    if not args.json:
        _print_compare(payload)
    return payload


def _print_compare(payload: dict) -> None:
    from rich.table import Table

    from tag.units import format_bytes, format_time

    payload = _shown(payload)  # names from the user's files print as written

    table = Table(title=f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                        f"({payload['devices']} devices): every planner, one simulator")
    for column in ("planner", "iteration", "vs DP-NCCL", "peak memory", "search", "gap to bound", "fits"):
        table.add_column(column, justify="left" if column == "planner" else "right")
    for row in payload["planners"]:
        speedup = f"{row['speedup_over_dp_nccl']:.2f}x" if row["speedup_over_dp_nccl"] else "-"
        if row["gap"] is None:
            gap = "-"
        else:
            gap = "[green]optimal[/]" if row["proven_optimal"] else f"{100 * row['gap']:.1f}%"
        fits = "[green]yes[/]" if row["feasible"] else f"[red]{row.get('note', 'OOM')}[/]"
        memory = format_bytes(row["peak_memory_bytes"]) if row["peak_memory_bytes"] == row["peak_memory_bytes"] else "-"
        table.add_row(row["planner"], format_time(row["iteration_time_s"]), speedup, memory,
                      format_time(row["search_time_s"]), gap, fits)
    _console().print(table)


# ---------------------------------------------------------------------------------------------- parser
def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="zoo name, graph .json(.gz), PipeDream graph.txt, or MODULE:FUNCTION")
    parser.add_argument("--batch-size", type=_batch_size, default=None, help="global batch size (default: the model's)")
    parser.add_argument("--tiny", action="store_true", help="the zoo model's tiny variant")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one ``tag: error:`` line and exit status 2, like every other bad input (the
    usage is for --help); subparsers, `tag run`'s and `tag train`'s included, are of this class too."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("tag").strip()
        message = "".join(c if c.isprintable() else " " for c in message)  # an argument may hold a newline
        self.exit(EXIT_BAD_INPUT, f"tag: error: {command + ': ' if command else ''}{message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tag", description="Plan distributed DNN training on heterogeneous GPU clusters.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("models", help="list the model zoo")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("clusters", help="list cluster presets and generators")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_clusters)

    p = sub.add_parser("show", help="summarise a model: ops by role, parameters, FLOPs, memory, where it fits")
    _add_model(p)
    p.add_argument("--cluster", type=_named, help="preset NAME[:ARGS] or a YAML/JSON spec file")
    p.add_argument("--json", action="store_true")
    _add_profile(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("trace", help="trace a model (zoo name or MODULE:FUNCTION) into an OpGraph file")
    _add_model(p)
    p.add_argument("--out", type=_named, required=True, help="output graph file (.json or .json.gz)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("plan", help="the fastest plan of every family: TAG placement, data parallelism, pipelines, "
                                    "graph pipelines")
    _add_model(p)
    _add_cluster(p)
    p.add_argument("--family", choices=_plan_families(), default="all",
                   help="plan families to ask (default all; placement: TAG's search alone, with its own report)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=_positive_int, metavar="N", help="search iterations (default 600)")
    budget.add_argument("--time", type=_positive_seconds, metavar="S",
                        help="time budget in seconds (the placement search takes what the other families leave)")
    priors = p.add_mutually_exclusive_group()
    priors.add_argument("--policy", type=_named, metavar="CKPT",
                        help="GNN policy checkpoint for the priors (default: the shipped checkpoints/tag-policy.pt)")
    priors.add_argument("--uniform", action="store_true", help="uniform priors: pure MCTS")
    p.add_argument("--search", choices=("mcts", "mcmc"), default="mcts", help="search method (default mcts)")
    p.add_argument("--no-sfb", action="store_true", help="skip sufficient-factor broadcasting")
    _add_grouping(p, seed_help="METIS and search seed")
    p.add_argument("--out", type=_named, metavar="PLAN.json",
                   help="write the plan file (for `tag simulate --strategy`)")
    _add_views(p)
    p.add_argument("--json", action="store_true")
    _add_profile(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="simulate one training iteration of a plan file or a baseline")
    _add_model(p)
    _add_cluster(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--strategy", type=_named, metavar="PLAN.json",
                      help="a plan file (from `tag plan --out` or `tag pipeline --out`)")
    what.add_argument("--baseline", choices=_baseline_names(), help="a baseline strategy")
    _add_simulation(p)
    _add_views(p)
    p.add_argument("--json", action="store_true")
    _add_profile(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("baselines", help="simulate the baselines (DP-NCCL, DP-NCCL-P, Horovod, one device, METIS MP)")
    _add_model(p)
    _add_cluster(p)
    _add_simulation(p)
    p.add_argument("--only", metavar="A,B", help="comma-separated subset of " + ", ".join(_baseline_names()))
    p.add_argument("--json", action="store_true")
    _add_profile(p)
    p.set_defaults(func=cmd_baselines)

    from tag.training.cli import add_train_parser  # torch is imported only when `tag train` runs

    add_train_parser(sub)

    from tag.execute.cli import add_run_parser  # torch is imported only when `tag run` runs

    add_run_parser(sub)

    from tag.profile.cli import add_profile_parser  # torch is imported only when `tag profile` runs

    add_profile_parser(sub)

    p = sub.add_parser("compare", help="every planner on one model and cluster through one simulator")
    _add_model(p)
    _add_cluster(p)
    p.add_argument("--budget", type=_positive_int, default=300, metavar="N",
                   help="search iterations of MCMC, pure MCTS and tag (default 300)")
    p.add_argument("--policy", type=_named, metavar="CKPT",
                   help="GNN policy checkpoint for the tag (GNN+MCTS) row (default: the shipped one)")
    p.add_argument("--time-limit", type=_positive_seconds, default=60.0, metavar="S",
                   help="seconds for the exact mapper (default 60)")
    p.add_argument("--no-graphpipe", action="store_true", help="leave GraphPipe's graph pipeline out")
    _add_mapper_policy(p)
    _add_grouping(p, seed_help="METIS, search and mapper seed")
    p.add_argument("--json", action="store_true")
    _add_profile(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("pipeline", help="exact pipeline planning: partition into stages, map them onto devices, simulate")
    _add_model(p)
    _add_cluster(p)
    p.add_argument("--stages", type=_positive_int, metavar="S", help="pipeline stages (with --auto: only this S)")
    p.add_argument("--replicas", type=_positive_int, metavar="R", help="replicas per stage (with --auto: only this R)")
    p.add_argument("--auto", action="store_true", help="search (S, R, micro-batches) by simulation (the default "
                                                       "when neither --stages nor --replicas is given)")
    p.add_argument("--micro-batches", type=_micro_batches, metavar="M", help="micro-batches (default: searched)")
    p.add_argument("--partitioner", choices=(*_pipeline_choices("PARTITIONERS"), "best", "graphpipe"),
                   default="parmesan", help="stage partitioner (default parmesan; best: each of parmesan, pipedream "
                                            "and rannc, the fastest plan; graphpipe: stages that form a graph)")
    p.add_argument("--mapper", choices=_pipeline_choices("MAPPERS"), default="exact",
                   help="stage-to-device mapper (default exact: provably optimal or its gap; learned: GNN + MCTS; "
                        "learned-fast: its fast setting, about a tenth of exact's time at 64 devices)")
    _add_mapper_policy(p)
    p.add_argument("--time-limit", type=_positive_seconds, default=60.0, metavar="S",
                   help="seconds for the exact mapper (default 60)")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="micro-batch order (default 1f1b)")
    p.add_argument("--links", choices=("data", "chain"), default="data",
                   help="stage edges: data (activations sent directly, the default) or chain (a sequential "
                        "runtime: stage s sends to s+1 only, passing the rest through)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the random mappings")
    p.add_argument("--out", type=_named, metavar="PLAN.json",
                   help="write the pipeline plan (for `tag simulate --strategy`)")
    _add_views(p)
    p.add_argument("--json", action="store_true")
    _add_profile(p)
    p.set_defaults(func=cmd_pipeline)
    return parser


def _add_mapper_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mapper-policy", type=_named, metavar="CKPT",
                   help="mapping GNN checkpoint of the learned mapper (default: the shipped checkpoints/tag-mapper.pt)")


def _plan_families() -> tuple[str, ...]:
    """tag.planners.cli.FAMILY_CHOICES, written out so that building the parser imports no planner."""
    return ("all", "placement", "data-parallel", "pipeline", "graph-pipeline", "graph")


def _pipeline_choices(name: str) -> tuple[str, ...]:
    """tag.exact.PARTITIONERS or tag.exact.MAPPERS, imported only when the parser is built."""
    import tag.exact

    return tuple(getattr(tag.exact, name))


def _baseline_names() -> list[str]:
    from tag.baselines import BASELINES

    return list(BASELINES)


def _add_cluster(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", type=_named, required=True, help="preset NAME[:ARGS] or a YAML/JSON spec file (`tag clusters`)")


def _add_grouping(parser: argparse.ArgumentParser, *, seed_help: str = "METIS seed") -> None:
    parser.add_argument("--num-groups", type=_num_groups, default=60, help="METIS op groups (default 60, as TAG)")
    parser.add_argument("--seed", type=_seed, default=0, help=seed_help)


def _add_simulation(parser: argparse.ArgumentParser) -> None:
    _add_grouping(parser)
    parser.add_argument("--granularity", choices=("op", "group", "part"), default="group",
                        help="task granularity of the compiled plan (op: the exact reference; default group)")


def _add_profile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", metavar="PROFILE.json",
                        help="measured op times from `tag profile` for the GPU types it covers (else the roofline)")


def _profile_cost(args: argparse.Namespace):
    """The cost model of ``--profile`` (None: the roofline's default)."""
    from tag.profile.cli import profile_cost_model

    return profile_cost_model(getattr(args, "profile", None))


def _add_views(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=_named, metavar="T.json", help="write a Chrome trace (chrome://tracing, Perfetto)")
    parser.add_argument("--gantt", type=_named, metavar="G.png", help="draw a Gantt chart of the simulated iteration")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command: Callable[[argparse.Namespace], dict] = args.func
    try:
        with staged_outputs() as args.stage:  # every output file lands when the command succeeds, or none
            payload = command(args)
    except TagError as error:
        # one line whatever names it quotes: newlines, carriage returns and terminal escapes become spaces
        message = "".join(c if c.isprintable() else " " for c in str(error))
        sys.stderr.write(f"tag: error: {message}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write("tag: interrupted\n")
        return 130
    if getattr(args, "json", False):
        _print_json(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
