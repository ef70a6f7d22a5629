"""Every human-readable report of the `tag` command, and the ``--json`` printer.

Each ``render_*`` takes the payload its command returns (what ``--json`` prints) and draws it with rich,
in at most 80 columns: headers are short and a table keeps the columns that say how good a plan is; the
payload keeps every field. Names from the user's files are escaped for rich markup (:func:`shown`).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

__all__ = ["WIDTH", "console", "shown", "print_json", "print_files", "render_models", "render_clusters",
           "render_show", "render_trace", "render_simulation", "render_pipeline_simulation", "render_baselines",
           "render_placement", "render_families", "render_pipeline", "render_graph_pipeline", "render_compare",
           "render_run", "render_profile"]

WIDTH = 80  # columns a report fits in


def console():
    from rich.console import Console

    return Console(highlight=False)


def _table(title: str, columns: tuple[str, ...], *, left: tuple[str, ...] = (), wrap: tuple[str, ...] = (),
           widest: dict[str, int] | None = None, **options):
    """A rich table with ``columns``, right-justified unless named in ``left``; only the ``wrap`` columns
    may wrap (a long name or note), the others keep one line so that numbers stay whole; a column named in
    ``widest`` is cut to that many characters with an ellipsis (its full text is in --json)."""
    from rich import box
    from rich.table import Table

    widest = widest or {}
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True,
                  min_width=min(len(title), WIDTH), **options)  # a title wider than the columns stays on one line
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right", no_wrap=column not in wrap,
                         max_width=widest.get(column), overflow="ellipsis")
    return table


def _pairs(title: str):
    """A two-column what/value table without a header."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, show_header=False, box=box.SIMPLE, pad_edge=False, show_edge=False,
                  collapse_padding=True, min_width=min(len(title), WIDTH))
    table.add_column("what")
    table.add_column("value", justify="right")
    return table


def shown(value: Any) -> Any:
    """``value`` with every string escaped for rich markup, so that names from the user's files (a cluster
    called "[/]") print as written; the printers add their own markup around them."""
    from rich.markup import escape

    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {key: shown(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown(item) for item in value]
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


def print_json(payload: Any) -> None:
    text = json.dumps(_finite(payload), separators=(", ", ": "), default=float, allow_nan=False)
    sys.stdout.write(text + "\n")


def print_files(out, files: dict) -> None:
    for kind, path in files.items():
        out.print(f"wrote {kind}: {path}")


def _fits(feasible: bool, oom_device=None) -> str:
    if feasible:
        return "[green]fits[/]"
    return "[red]OOM[/]" if oom_device is None else f"[red]OOM on device {oom_device}[/]"


def _rate(samples_per_s) -> str:
    return f"{samples_per_s:.1f}" if samples_per_s else "-"


def _notes(out, notes: list[tuple[str, str]]) -> None:
    """What a table's rows leave out, one ``name: note`` line each (a note is prose of any length)."""
    for name, note in notes:
        if note:
            out.print(f"  {name}: {note}")


def _devices(devices: list, limit: int) -> str:
    """Device ids, or the first…last (count) of a long list."""
    if len(devices) <= limit:
        return ",".join(map(str, devices))
    return f"{devices[0]}…{devices[-1]} ({len(devices)})"


# ------------------------------------------------------------------------------------ models, clusters
def render_models(payload: dict) -> None:
    """The zoo; the papers each model's size comes from are in ``--json`` (``paper_source``)."""
    table = _table("Model zoo (tag.models)", ("name", "batch", "params", "description"), left=("name", "description"),
                   wrap=("description",))
    for row in payload["models"]:
        params = f"{row['paper_parameters'] / 1e6:.1f}M" if row["paper_parameters"] else "-"
        table.add_row(row["name"], str(row["batch_size"]), params, row["description"])
    console().print(table)


def render_clusters(payload: dict) -> None:
    """Each preset as it is passed to ``--cluster`` (its name with example arguments)."""
    table = _table("Cluster presets (--cluster NAME[:ARGS] or a YAML/JSON spec file)",
                   ("preset", "devices", "description"), left=("preset", "description"), wrap=("description",))
    for row in payload["clusters"]:
        table.add_row(row.get("address", row["name"]), str(row["devices"]), row.get("description", ""))
    console().print(table)


# ---------------------------------------------------------------------------------------- show, trace
def render_show(payload: dict) -> None:
    from tag.units import format_bytes, format_time

    out = console()
    payload = shown(payload)
    table = _pairs(f"{payload['model']} (batch {payload['batch_size']}, from {payload['source']})")
    table.add_row("parameters", f"{payload['parameters']:,} ({format_bytes(payload['parameter_bytes'])})")
    for role, n in payload["ops"].items():
        table.add_row(f"{role} ops", f"{n:,}")
    table.add_row("edges", f"{payload['edges']:,}")
    table.add_row("FLOPs per iteration", f"{payload['flops_per_iteration']:.3e}")
    table.add_row("training memory (Adam)", format_bytes(payload["training_memory_bytes"]))
    out.print(table)
    if "fits_on" not in payload:
        return
    fit = _table(f"Fit on {payload['cluster']['name']} ({payload['cluster']['devices']} devices)",
                 ("GPU", "count", "memory", "fits whole model", "one-device iteration"), left=("GPU",))
    for row in payload["fits_on"]:
        fit.add_row(row["gpu"], str(row["count"]), format_bytes(row["memory_bytes"]),
                    "[green]yes[/]" if row["fits"] else "[red]no[/]", format_time(row["single_device_iteration_s"]))
    out.print(fit)


def render_trace(payload: dict) -> None:
    roles = ", ".join(f"{n} {role}" for role, n in payload["ops"].items())
    console().print(f"wrote {shown(payload['out'])}: {sum(payload['ops'].values())} ops ({roles}), "
                    f"{payload['edges']} edges, {payload['parameters']:,} parameters")


# ------------------------------------------------------------------------------------ simulate, baselines
def render_simulation(payload: dict, gpu_names: list[str]) -> None:
    """``tag simulate`` of a placement plan or a baseline; ``gpu_names[d]``: device d's GPU type."""
    from tag.units import format_bytes, format_time

    out = console()
    payload = shown(payload)
    out.print(f"{payload['model']} on {payload['cluster']}, {payload['what']}: "
              f"iteration {format_time(payload['iteration_time_s'])}, {payload['samples_per_s']:.1f} samples/s, "
              f"{_fits(payload['feasible'], payload['oom_device'])} ({payload['tasks']:,} tasks)")
    table = _table("Peak memory per device", ("device", "GPU", "peak", "capacity", "use"))
    for d, (peak, cap) in enumerate(zip(payload["peak_memory_bytes"], payload["memory_capacity_bytes"])):
        share = peak / cap if cap else 0.0
        colour = "red" if share > 1 else "default"
        table.add_row(str(d), shown(gpu_names[d]), format_bytes(peak), format_bytes(cap), f"[{colour}]{share:.0%}[/]")
    out.print(table)
    print_files(out, payload["files"])


def render_pipeline_simulation(payload: dict) -> None:
    """``tag simulate`` of a pipeline plan file."""
    from tag.units import format_time

    out = console()
    payload = shown(payload)
    out.print(f"{payload['model']} on {payload['cluster']}, {payload['what']}: {payload['stages']} stages x "
              f"{payload['replicas']} replicas, {payload['micro_batches']} micro-batches ({payload['schedule']}): "
              f"iteration {format_time(payload['iteration_time_s'])}, {payload['samples_per_s']:.1f} samples/s, "
              f"{_fits(payload['feasible'], payload['oom_device'])} ({payload['tasks']:,} tasks)")
    print_files(out, payload["files"])


def render_baselines(payload: dict) -> None:
    """The baselines' table; each one's note (what it ran) below it."""
    from tag.units import format_bytes, format_time

    payload = shown(payload)
    table = _table(f"Baselines: {payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                   f"({payload['devices']} devices)",
                   ("baseline", "iteration", "samples/s", "vs DP-NCCL", "peak", "fits"), left=("baseline", "fits"))
    for row in payload["baselines"]:
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        fits = "[green]yes[/]" if row["feasible"] else f"[red]OOM on {row['oom_device']}[/]"
        table.add_row(row["name"], format_time(row["iteration_time_s"]), f"{row['samples_per_s']:.1f}", speedup,
                      format_bytes(row["max_peak_memory_bytes"]), fits)
    out = console()
    out.print(table)
    _notes(out, [(row["name"], row["note"]) for row in payload["baselines"]])


# ------------------------------------------------------------------------------------------------ plan
def render_placement(payload: dict, cluster) -> None:
    """``tag plan --family placement``: TAG's plan per op group and its summary."""
    from tag.units import format_time

    out = console()
    payload = shown(payload)
    out.print(_groups_table(payload, cluster.num_device_groups))
    summary = _pairs(f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                     f"({payload['devices']} devices)")
    summary.add_row("iteration time", f"{format_time(payload['iteration_time_s'])} "
                                      f"({_fits(payload['feasible'], payload['oom_device'])})")
    summary.add_row("samples/s", _rate(payload["samples_per_s"]))
    summary.add_row("compute bound", f"{format_time(payload['compute_bound_s'])} ({payload['bound_ratio']:.2f}x)")
    for baseline in payload["baselines"]:
        ratio = payload["speedup_over"][baseline["name"]]
        oom = " (baseline OOM)" if baseline["oom"] else ""
        summary.add_row(f"speed-up over {baseline['name']}",
                        (f"{ratio:.3f}x" if ratio else "-") + f"  [{format_time(baseline['iteration_time_s'])}{oom}]")
    _peak_rows(summary, payload, cluster)
    out.print(summary)
    out.print(f"search: {payload['search']}, {payload['priors']}: {payload['iterations']} iterations, "
              f"{payload['simulations']} simulations, {format_time(payload['search_time_s'])}")
    if payload["sfb"] is not None:
        sfb = payload["sfb"]
        out.print(f"SFB: {sfb['groups_kept']} groups, {sfb['gradients_replaced']} gradients, "
                  f"{sfb['ops_duplicated']} ops duplicated, saves {format_time(sfb['simulated_time_saved_s'])} "
                  "(simulated)")
    print_files(out, payload["files"])


def _groups_table(payload: dict, num_device_groups: int):
    """One row per op group: its device groups ("all", or their ids), how many devices, its option (with
    "+SFB" where sufficient factors replace its gradients), compute, makespan and parameters (its op count
    and device ids are in --json)."""
    from tag.units import format_bytes, format_time

    groups = _table(f"Plan per op group ({payload['num_groups']} groups, most compute first)",
                    ("group", "dev groups", "devs", "option", "compute", "makespan", "params"),
                    left=("dev groups", "option"))
    for row in payload["groups"]:
        makespan = format_time(row["makespan_s"]) if row["makespan_s"] is not None else "-"
        placed = row["device_groups"]
        groups.add_row(str(row["group"]), "all" if len(placed) == num_device_groups else _devices(placed, 5),
                       str(len(row["devices"])), row["option"] + ("+SFB" if row["sfb"] else ""),
                       format_time(row["compute_s"]), makespan, format_bytes(row["param_bytes"]))
    return groups


def _peak_rows(summary, payload: dict, cluster) -> None:
    """One row per device group: its fullest device's peak memory against its capacity."""
    from tag.units import format_bytes

    peaks = payload["peak_memory_bytes"]
    capacity = payload["memory_capacity_bytes"]
    for m in range(cluster.num_device_groups):
        members = [d for d in range(cluster.num_devices) if cluster.device_group[d] == m]
        worst = max(members, key=lambda d: peaks[d] / capacity[d])
        summary.add_row(f"peak memory, device group {m} ({shown(cluster.gpu(worst).name)} x{len(members)})",
                        f"{format_bytes(peaks[worst])} of {format_bytes(capacity[worst])}")


_FAMILY_SHORT = {"data-parallel": "DP", "graph-pipeline": "graph"}  # family names in the 80-column table


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 0.1 else f"{value * 1e3:.0f} ms"


def _iteration(value: float) -> str:
    """Four significant digits, so that the table fits 80 columns."""
    if value >= 10:
        return f"{value:.1f} s"
    return f"{value * 1e3:.4g} ms" if value >= 1e-3 else f"{value * 1e6:.4g} us"


def _shape(text: str, limit: int = 18) -> str:
    """A plan's shape ("3x9/6/1 M=8") in at most ``limit`` characters: a long replica list is cut, its
    micro-batch count kept."""
    if len(text) <= limit:
        return text
    head, sep, tail = text.rpartition(" M=")
    if not sep:
        head, tail = text, ""
    tail = f"{sep}{tail}" if sep else ""
    return head[:max(limit - len(tail) - 1, 1)] + "…" + tail


def render_families(payload: dict) -> None:
    """``tag plan`` over plan families: each family's plans, the compute bound and the chosen plan."""
    from tag.units import format_bytes, format_time

    payload = shown(payload)
    table = _table(f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                   f"({payload['devices']} devices)",
                   ("family", "planner", "plan", "iteration", "x bound", "peak", "planned"),
                   left=("family", "planner", "plan"))
    chosen = (payload["family"], payload["planner"])
    notes = []
    for row in payload["candidates"]:
        family = _FAMILY_SHORT.get(row["family"], row["family"])
        if row["iteration_time_s"] is None:  # no plan: why, below the table
            notes.append((row["planner"], row["note"]))
            table.add_row(family, row["planner"], "[dim]no plan[/]", "-", "-", "-", _seconds(row["planning_time_s"]))
            continue
        mark = (row["family"], row["planner"]) == chosen
        oom = "" if row["feasible"] else " [red]OOM[/]"
        table.add_row(family, f"[bold green]{row['planner']}[/]" if mark else row["planner"], _shape(row["shape"]),
                      _iteration(row["iteration_time_s"]) + oom, f"{row['bound_ratio']:.2f}",
                      format_bytes(row["peak_memory_bytes"]), _seconds(row["planning_time_s"]))
    out = console()
    out.print(table)
    _notes(out, notes)
    out.print(f"compute bound {format_time(payload['compute_bound_s'])}: one iteration's work over the "
              "devices' summed speed")
    state = "fits" if payload["feasible"] else "[red]OOM[/]"
    out.print(f"chosen: {payload['family']}, {payload['planner']} ({payload['shape']}): "
              f"{format_time(payload['iteration_time_s'])}, {payload['bound_ratio']:.2f}x the bound, {state}")
    out.print(f"planned in {_seconds(payload['planning_time_s'])}")
    print_files(out, payload["files"])


# -------------------------------------------------------------------------------------------- pipeline
def render_pipeline(payload: dict) -> None:
    """``tag pipeline``: the stages of the plan and its summary."""
    from tag.units import format_bytes, format_time

    out = console()
    payload = shown(payload)
    stages = _table(f"Pipeline stages ({payload['partitioner']}, {payload['micro_batches']} micro-batches, "
                    f"{payload['schedule']})", ("stage", "ops", "compute/mb", "time/iter", "params", "devices"),
                    left=("devices",))
    bottleneck = payload["max_stage_time_s"]
    for row in payload["stage_rows"]:
        per_iteration = row["time_per_iteration_s"]
        text = "-" if per_iteration is None else format_time(per_iteration)
        if per_iteration is not None and per_iteration == bottleneck:
            text = f"[bold]{text}[/]"
        stages.add_row(str(row["stage"]), f"{row['ops']:,}", format_time(row["compute_per_micro_batch_s"]), text,
                       format_bytes(row["param_bytes"]), _devices(row["devices"], 8))
    out.print(stages)
    out.print("compute/mb: a stage's compute per micro-batch; time/iter: its time per iteration")
    summary = _pairs(f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                     f"({payload['devices']} devices)")
    summary.add_row("stages x replicas", f"{payload['stages']} x {payload['replicas']}")
    summary.add_row("iteration time (simulated)", f"{format_time(payload['iteration_time_s'])} "
                                                  f"({_fits(payload['feasible'])})")
    summary.add_row("samples/s", _rate(payload["samples_per_s"]))
    kind = f" ({payload['instantiation']})" if payload.get("instantiation") else ""
    summary.add_row(f"max stage time / iteration{kind}", format_time(bottleneck))
    if payload["lower_bound_s"] is not None:
        proof = "[green]proven optimal[/]" if payload["proven_optimal"] else f"gap {100 * (payload['gap'] or 0):.1f}%"
        summary.add_row("lower bound", f"{format_time(payload['lower_bound_s'])} ({proof})")
    summary.add_row(f"mapper ({payload['mapper']})", format_time(payload["solve_time_s"]))
    summary.add_row("peak memory (max device)", format_bytes(payload["peak_memory_bytes"]))
    out.print(summary)
    if payload.get("mapper_skipped"):
        out.print(f"mapper skipped: {payload['mapper_skipped']}")
    print_files(out, payload["files"])


def render_graph_pipeline(payload: dict) -> None:
    """``tag pipeline --partitioner graphpipe``: GraphPipe's stage graph and its iteration."""
    from tag.units import format_bytes, format_time

    payload = shown(payload)
    table = _table(f"Graph pipeline (GraphPipe), {payload['micro_batches']} micro-batches, depth {payload['depth']}",
                   ("stage", "ops", "compute/mb", "in flight", "devices", "feeds"), left=("devices", "feeds"))
    for s, devices in enumerate(payload["mapping"]):
        feeds = [b for a, b in payload["stage_edges"] if a == s]
        table.add_row(str(s), f"{payload['stage_ops'][s]:,}", format_time(payload["stage_time_s"][s]),
                      str(payload["inflight"][s]), _devices(devices, 8), _devices(feeds, 6) or "-")
    out = console()
    out.print(table)
    out.print(f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']}: iteration "
              f"{format_time(payload['iteration_time_s'])} ({_fits(payload['feasible'])}), "
              f"{payload['samples_per_s']:.1f} samples/s, peak memory {format_bytes(payload['peak_memory_bytes'])}, "
              f"search {format_time(payload['solve_time_s'])}")
    print_files(out, payload["files"])


# --------------------------------------------------------------------------------------------- compare
def render_compare(payload: dict) -> None:
    """Every planner's row (its peak memory is in --json); why a planner gave no plan, below the table."""
    payload = shown(payload)
    table = _table(f"{payload['model']} (batch {payload['batch_size']}) on {payload['cluster']} "
                   f"({payload['devices']} devices): every planner, one simulator",
                   ("planner", "iteration", "vs DP-NCCL", "search", "gap", "fits"), left=("planner", "fits"),
                   widest={"planner": 34})
    notes = []
    for row in payload["planners"]:
        speedup = f"{row['speedup_over_dp_nccl']:.2f}x" if row["speedup_over_dp_nccl"] else "-"
        if row["gap"] is None:
            gap = "-"
        else:
            gap = "[green]optimal[/]" if row["proven_optimal"] else f"{100 * row['gap']:.1f}%"
        if row["feasible"]:
            fits = "[green]yes[/]"
        elif row.get("note"):  # no plan: why, below the table
            fits = "[red]no[/]"
            notes.append((row["planner"], row["note"]))
        else:
            fits = "[red]OOM[/]"
        iteration = _iteration(row["iteration_time_s"]) if math.isfinite(row["iteration_time_s"]) else "-"
        table.add_row(row["planner"], iteration, speedup, _seconds(row["search_time_s"]), gap, fits)
    out = console()
    out.print(table)
    _notes(out, notes)


# ------------------------------------------------------------------------------------------------- run
def render_run(payload: dict) -> None:
    """``tag run``: loss and time per step, what moved, whether the plan's schedule held, the check."""
    from rich.markup import escape

    from tag.units import format_bytes, format_time

    out = console()
    table = _table(f"{escape(payload['model'])} on {escape(payload['cluster'])}: {payload['ranks']} ranks, batch "
                   f"{payload['batch_size']}", ("step", "loss", "step time"))
    for k, (loss, seconds) in enumerate(zip(payload["losses"], payload["step_times_s"])):
        table.add_row(str(k + 1), f"{loss:.6g}", format_time(seconds))
    out.print(table)
    out.print(f"{payload['transfers']} transfers and {payload['collectives']} collectives per step, "
              f"{format_bytes(payload['bytes_moved'])} moved; median step {format_time(payload['median_step_s'])}")
    schedule = payload.get("schedule")
    if schedule:
        out.print(f"pipeline runtime: {schedule['runtime']}")
    if schedule and not schedule["followed"] and schedule["waits_on"]:
        out.print(f"[yellow]the ranks could not follow the plan's schedule: every backward pass waits for "
                  f"{', '.join(map(escape, schedule['waits_on'][:3]))}, summed over all micro-batches[/]")
    elif schedule and not schedule["followed"]:
        out.print("[yellow]the ranks ran another order than the plan's schedule[/]")
    if schedule and schedule.get("per_micro_batch"):
        out.print(f"[yellow]torch's schedule normalised {', '.join(map(escape, schedule['per_micro_batch'][:3]))} "
                  "per micro-batch: --check says whether that changes the step[/]")
    check = payload.get("check")
    if check is None:
        return
    if not check["applies"]:
        out.print(f"[yellow]check: {check['reason']}[/]")
    rows = ", ".join(f"{g} {check[g]['rel']:.1e}" for g in ("loss", "grads", "params"))
    verdict = "[green]equal to one device[/]" if check["passed"] else "[red]differs from one device[/]"
    out.print(f"check against the single-device step (largest relative difference): {rows}: {verdict}")


# --------------------------------------------------------------------------------------------- profile
def render_profile(payload: dict) -> None:
    """``tag profile``: step times, the roofline's agreement per op kind, the communication measured."""
    from tag.units import format_bytes, format_time

    out = console()
    payload = shown(payload)
    steps = ", ".join(f"batch {s['batch']}: {format_time(s['measured_s'])} (fit {format_time(s['fit_s'])})"
                      for s in payload["steps"])
    out.print(f"{payload['model']} on {payload['device']} ({payload['description']}): {payload['timed_ops']} of "
              f"{payload['ops']} ops timed; summed op time per step: {steps}")
    if payload["executor_overhead_s"]:
        out.print(f"tag run's executor adds {format_time(payload['executor_overhead_s'])} per op")
    table = _table("Roofline against measured, per op kind (at the traced batch)",
                   ("op kind", "ops", "measured", "roofline", "Spearman", "median ratio"),
                   left=("op kind",), widest={"op kind": 28})
    for row in payload["roofline"]["by_kind"]:
        rho = "-" if row["spearman"] != row["spearman"] else f"{row['spearman']:.2f}"
        table.add_row(row["kind"], str(row["ops"]), format_time(row["measured_s"]), format_time(row["roofline_s"]),
                      rho, f"{row['median_ratio']:.2f}")
    out.print(table)
    fit = payload["roofline"]["fit"]
    if fit is not None:
        out.print(f"roofline calibrated to these times (for steps the profile did not measure): launch "
                  f"{format_time(fit['launch_overhead_s'])}, compute efficiency {fit['compute_efficiency']:.3g}, "
                  f"memory {fit['memory_efficiency']:.3g} (rms log error {fit['rms_log_error']:.2f})")
    for kind, c in payload["comm"].items():
        out.print(f"{kind} ({c['backend']}, {c['processes']} processes): latency {format_time(c['latency_s'])}, "
                  f"bandwidth {format_bytes(c['bandwidth'])}/s")
    out.print(f"wrote {payload['out']}")
    if payload["cluster"]:
        out.print(f"plan for this host with --cluster {payload['cluster']} --profile {payload['out']}")
