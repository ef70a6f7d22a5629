"""Run a placement plan on torch.distributed and hold it against the single-device step.

:func:`run_strategy` compiles the strategy at op granularity, checks the compiled plan
(:func:`tag.compiler.check_compiled`), lowers it to rank programs, starts the ranks and combines what
they report into the values one device would hold: a batch-split group's partial sums are added, its
rows concatenated, anything else taken from its first holder (and every other holder must agree).
With ``check`` the same steps run eagerly on one process (the tracer's train step: ``functional_call``,
``autograd.grad``, the functional Adam) and every loss, gradient and updated parameter is compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tag.cluster import Cluster
from tag.compiler.check import check_compiled
from tag.compiler.compile import CompiledPlan, compile_strategy
from tag.execute.launch import DEFAULT_TIMEOUT_S, WorkerPool, launch
from tag.execute.lower import ExecutionError, RankProgram, combine_rule, lower_plan
from tag.execute.program import Program
from tag.grouping import GroupGraph
from tag.strategy import Strategy

__all__ = ["RunResult", "run_strategy", "combine_values", "allowed_coupling", "coupled_in_plan", "reference_steps",
           "compare_steps", "CHECK_TOLERANCE"]

CHECK_TOLERANCE = 1e-5  # largest relative difference (fp32) that passes --check


@dataclass
class RunResult:
    """What a run measured: per-step loss and wall time, and with ``check`` the differences."""

    losses: list[float]
    step_times_s: list[list[float]]  # [steps][ranks]
    communication: list[tuple]  # (task, kind, endpoints, bytes, tensors) as executed, every rank
    check: dict | None = None  # {"loss"|"grads"|"params": {"abs": .., "rel": .., "worst": name}, "passed": bool}
    coupled: dict = field(default_factory=dict)  # op name -> why a batch split changes it (allowed by the user)
    values: list[dict] = field(default_factory=list, repr=False)  # per step: name -> combined tensor
    schedule: dict | None = None  # pipelines: {"followed": bool, "waits_on": [...]} (LoweredPipeline)

    @property
    def median_step_s(self) -> float:
        """Median over steps (the first, warm-up, left out when there are several) of the slowest rank."""
        per_step = [max(t) for t in self.step_times_s]
        return float(np.median(per_step[1:] if len(per_step) > 1 else per_step))

    def summary(self) -> dict[str, Any]:
        return {"losses": self.losses, "step_times_s": [max(t) for t in self.step_times_s],
                "median_step_s": self.median_step_s, "transfers": sum(c[1] == "transfer" for c in self.communication),
                "collectives": sum(c[1] != "transfer" for c in self.communication),
                "bytes_moved": float(sum(c[3] for c in self.communication)), "check": self.check,
                "batch_coupled_ops": self.coupled, **({"schedule": self.schedule} if self.schedule else {})}


def coupled_in_plan(program: Program, compiled: CompiledPlan) -> dict[str, str]:
    """The batch-coupled ops this plan changes: random ops anywhere on several ranks, batch statistics in a
    batch-split group."""
    found = {}
    multi = compiled.cluster.num_devices > 1
    for op, why in program.coupled.items():
        layout = compiled.layouts[int(compiled.group_graph.assignment[op])]
        if (why == "random numbers" and multi) or layout.split:
            found[program.graph.names[op]] = why
    return found


def allowed_coupling(program: Program, compiled: CompiledPlan, allow: bool) -> dict[str, str]:
    """:func:`coupled_in_plan`, refused with one line naming the first unless ``allow``."""
    coupled = coupled_in_plan(program, compiled)
    if coupled and not allow:
        name, why = next(iter(coupled.items()))
        raise ExecutionError(f"op {name!r} ({why}) computes something else once the plan splits the batch; "
                             f"{len(coupled)} such op(s) in all: pass --allow-batch-coupled to run anyway")
    return coupled


def run_strategy(program: Program, group_graph: GroupGraph, strategy: Strategy, cluster: Cluster, *,
                 steps: int = 2, check: bool = False, allow_batch_coupled: bool = False, backend: str = "gloo",
                 timeout_s: float = DEFAULT_TIMEOUT_S, pool: WorkerPool | None = None, port: int | None = None,
                 faults: dict | None = None, progress=None) -> RunResult | None:
    """Run ``strategy`` for ``steps`` optimizer steps, one process per device of ``cluster`` (or this
    process's rank of a torchrun launch: None off rank 0)."""
    if group_graph.op_graph.num_ops != program.graph.num_ops:
        raise ExecutionError("the grouping is for another graph than the program's")
    compiled = compile_strategy(group_graph, strategy, cluster, granularity="op")
    check_compiled(compiled)
    coupled = allowed_coupling(program, compiled, allow_batch_coupled)
    programs = lower_plan(program, compiled)
    reports = launch(programs, program.tensors, steps=steps, backend=backend, port=port, timeout_s=timeout_s,
                     pool=pool, faults=faults, progress=progress)
    if reports is None:
        return None  # a torchrun rank other than 0: rank 0 reports
    values = [combine_values(program, compiled, programs, reports, k) for k in range(steps)]
    result = RunResult(losses=[float(v["loss:loss"]) for v in values],
                       step_times_s=[[r["times"][k] for r in reports] for k in range(steps)],
                       communication=[c for p in programs for c in p.communication()], coupled=coupled, values=values)
    if check:
        result.check = compare_steps(values, reference_steps(program, steps), coupled)
    return result


def combine_values(program: Program, compiled: CompiledPlan, programs: list[RankProgram], reports: list[dict],
             step: int) -> dict[str, torch.Tensor]:
    """name → the single-device value, from every rank's report of step ``step``."""
    holders: dict[str, list[tuple[int, int, torch.Tensor]]] = {}
    for rank_program, report in zip(programs, reports):
        for name, (_, op) in rank_program.outputs.items():
            holders.setdefault(name, []).append((rank_program.rank, op, report["results"][step][name]))
    combined = {}
    for name, values in holders.items():
        op = values[0][1]
        rule = combine_rule(program, compiled, op)
        tensors = [v for _, _, v in sorted(values, key=lambda x: x[0])]
        if rule == "sum":
            combined[name] = sum(tensors[1:], tensors[0].clone())
        elif rule == "rows":
            combined[name] = torch.cat(tensors, program.batch_dim(op, 0)[0])
        else:
            first = tensors[0]
            for other in tensors[1:]:
                if other.shape != first.shape or not torch.allclose(other, first, rtol=1e-6, atol=1e-7):
                    raise ExecutionError(f"the ranks holding {name} disagree on its value")
            combined[name] = first
    return combined


def reference_steps(program: Program, steps: int) -> list[dict[str, torch.Tensor]]:
    """``steps`` single-device train steps from the program's initial tensors: name → value."""
    from tag.execute.runtime import call_record, decode

    graph = program.graph
    outputs = graph.meta["outputs"]
    names = {i: r["name"] for i, r in enumerate(graph.args) if r.get("target") == "placeholder"}
    state = {name: program.tensors[name] for name in names.values()}
    results = []
    for _ in range(steps):
        values: dict[int, Any] = {}
        for i in graph.topological_order().tolist():
            record = graph.args[i]
            if record.get("target") == "placeholder":
                values[i] = state[record["name"]]
            else:
                values[i] = call_record(record, lambda p, out: _pick(values[p], out))
        step = {}
        for group, entries in outputs.items():
            named = {"loss": entries} if group == "loss" else entries
            for key, ref in named.items():
                if ref is not None:
                    value = decode(ref, lambda p, out: _pick(values[p], out))
                    if isinstance(value, torch.Tensor):
                        step[f"{group}:{key}"] = value.detach().clone()
        results.append(step)
        prefix = {"params": "parameter", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "buffers": "buffer"}
        for name, value in step.items():
            group, _, key = name.partition(":")
            if group in prefix and f"{prefix[group]}:{key}" in state:
                state[f"{prefix[group]}:{key}"] = value
    return results


def _pick(value: Any, out: int) -> Any:
    return value[out] if isinstance(value, (tuple, list)) else value


def compare_steps(got: list[dict], expected: list[dict], coupled: dict) -> dict[str, Any]:
    """Largest absolute and relative (to the tensor's largest magnitude) differences of loss, gradients and
    updated parameters over the steps.

    A gradient whose exact value is zero (a key bias under softmax) is all round-off: a tensor whose largest
    reference element is at most ``CHECK_TOLERANCE`` of the step's largest gradient is measured against that
    largest gradient instead. Adam's first steps move a parameter by about lr·sign(gradient), so an element
    whose reference gradient is round-off can move either way on any two machines; such elements are left
    out of the parameter comparison from that step on, and counted.
    """
    report: dict[str, Any] = {}
    noisy: dict[str, torch.Tensor] = {}
    skipped = 0
    for group in ("loss", "grads", "params"):
        worst = {"abs": 0.0, "rel": 0.0, "worst": None}
        for step, (a, b) in enumerate(zip(got, expected)):
            if group == "params":
                _mark_round_off(b, noisy)
            largest = max((float(v.abs().max()) for n, v in b.items() if n.startswith("grads:") and v.numel()),
                          default=0.0)
            for name, reference in b.items():
                if not name.startswith(group + ":") or name not in a:
                    continue
                diff_tensor = (a[name].double() - reference.double()).abs()
                mask = noisy.get(name.partition(":")[2]) if group == "params" else None
                if mask is not None and mask.shape == diff_tensor.shape:
                    skipped += int(mask.sum()) if step == len(expected) - 1 else 0
                    diff_tensor = diff_tensor.masked_fill(mask, 0.0)
                diff = float(diff_tensor.max()) if reference.numel() else 0.0
                scale = float(reference.double().abs().max()) if reference.numel() else 0.0
                if group == "grads" and scale <= CHECK_TOLERANCE * largest:
                    scale = largest
                rel = diff / scale if scale > 0 else diff
                if rel > worst["rel"]:
                    worst = {"abs": diff, "rel": rel, "worst": f"{name} (step {step + 1})"}
                worst["abs"] = max(worst["abs"], diff)
        report[group] = worst
    report["round_off_elements"] = skipped
    report["tolerance"] = CHECK_TOLERANCE
    report["passed"] = all(report[g]["rel"] <= CHECK_TOLERANCE for g in ("loss", "grads", "params"))
    report["applies"] = not coupled
    if coupled:
        report["reason"] = (f"{len(coupled)} batch-coupled op(s) ({', '.join(sorted(set(coupled.values())))}) "
                            "change the math under this plan: equivalence does not apply")
    return report


def _mark_round_off(step: dict[str, torch.Tensor], noisy: dict[str, torch.Tensor]) -> None:
    """Add to ``noisy[param]`` the elements whose gradient this step is round-off."""
    grads = {name.partition(":")[2]: g for name, g in step.items() if name.startswith("grads:")}
    largest = max((float(g.abs().max()) for g in grads.values() if g.numel()), default=0.0)
    for key, g in grads.items():
        mask = g.abs() <= CHECK_TOLERANCE * largest
        noisy[key] = mask if key not in noisy else noisy[key] | mask
