"""The roofline held against a profile: rank correlation and median ratio per op kind and per role, and
the roofline's efficiencies fitted to the measured times (:mod:`tag.cost.calibrate`)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from tag.cluster.gpus import GPUType
from tag.cost.calibrate import fit_efficiencies, profile_agreement, spearman
from tag.cost.compute import CostModel
from tag.graph.opgraph import ROLE_INPUT, OpGraph
from tag.profile.data import ModelTimes

__all__ = ["measured_at_reference", "agreement_by_kind", "agreement_table", "agreement_by_role", "roofline_fit"]


def measured_at_reference(graph: OpGraph, times: ModelTimes) -> np.ndarray:
    """[N] measured seconds at the graph's batch (the column measured there, else the fit), NaN where
    not timed."""
    timed = np.isfinite(times.measured_s).any(axis=1)
    if graph.batch_size in times.batch_sizes:
        column = times.measured_s[:, times.batch_sizes.index(graph.batch_size)]
    else:
        column = times.predicted(graph.batch_size) - times.executor_overhead_s  # the bare call's time
    return np.where(timed & (graph.role != ROLE_INPUT), column, np.nan)


def _roofline(graph: OpGraph, gpu: GPUType, cost: CostModel | None) -> np.ndarray:
    model = dataclasses.replace(cost if cost is not None else CostModel(), use_measured=False)
    return model.op_times(graph, gpu)  # the roofline itself, whatever profile ``cost`` holds


def agreement_by_kind(graph: OpGraph, times: ModelTimes, gpu: GPUType, *, cost: CostModel | None = None,
                      top: int = 12) -> list[dict]:
    """One row per op kind of one profiled step (:func:`agreement_table`)."""
    return agreement_table([(graph, times)], gpu, cost=cost, top=top)


def agreement_table(steps: list[tuple[OpGraph, ModelTimes]], gpu: GPUType, *, cost: CostModel | None = None,
                    top: int = 12) -> list[dict]:
    """One row per op kind over the ops of all ``steps`` (each at its traced batch), the ``top`` kinds by
    measured time first, then one row "all": ops, measured and roofline seconds summed, Spearman of
    roofline against measured over the kind's ops, and the median of roofline / measured."""
    measured = np.concatenate([measured_at_reference(graph, times) for graph, times in steps])
    predicted = np.concatenate([_roofline(graph, gpu, cost) for graph, _ in steps])
    kinds = [kind for graph, _ in steps for kind in graph.kinds]
    usable = np.isfinite(measured) & (measured > 0) & (predicted > 0)
    by_kind: dict[str, list[int]] = defaultdict(list)
    for op in np.flatnonzero(usable):
        by_kind[kinds[op]].append(int(op))
    order = sorted(by_kind, key=lambda k: -measured[by_kind[k]].sum())[:top]
    rows = [_row(kind, np.array(by_kind[kind]), measured, predicted) for kind in order]
    rows.append(_row("all", np.flatnonzero(usable), measured, predicted))
    return rows


def _row(kind: str, ops: np.ndarray, measured: np.ndarray, predicted: np.ndarray) -> dict:
    ratio = predicted[ops] / measured[ops]
    return {"kind": kind, "ops": int(ops.size), "measured_s": float(measured[ops].sum()),
            "roofline_s": float(predicted[ops].sum()),
            "spearman": spearman(predicted[ops], measured[ops]) if ops.size >= 3 else float("nan"),
            "median_ratio": float(np.median(ratio)) if ops.size else float("nan")}


def agreement_by_role(graph: OpGraph, times: ModelTimes, gpu: GPUType, *, cost: CostModel | None = None) -> dict:
    """:func:`tag.cost.calibrate.profile_agreement` of the measured times (forward and backward ops)."""
    marked = dataclasses.replace(graph, measured_time=measured_at_reference(graph, times),
                                 meta={**graph.meta, "measured_on": gpu.name})
    return profile_agreement(marked, cost_model=dataclasses.replace(cost if cost is not None else CostModel(),
                                                                   use_measured=False), gpu=gpu)


# An op whose roofline work is below this is all launch: its measured time is the device's per-op floor.
_LAUNCH_ONLY_S = 1e-6


def roofline_fit(steps: list[tuple[OpGraph, ModelTimes]], gpu: GPUType, *, dtype: str = "fp32") -> dict | None:
    """The roofline calibrated to the measured times of all ``steps``: the launch overhead (the median time
    of the ops with under a microsecond of roofline work: the floor an eager step pays per op), then the
    compute and memory efficiencies under it (:func:`tag.cost.calibrate.fit_efficiencies`). None when no
    op has both a measured time and a cost. Keys: launch_overhead_s, compute_efficiency,
    memory_efficiency, rms_log_error, samples."""
    measured = np.concatenate([measured_at_reference(graph, times) for graph, times in steps])
    work = np.concatenate([CostModel(dtype=dtype, use_measured=False).op_times(graph, gpu) - gpu.launch_overhead_s
                           for graph, _ in steps])
    flops = np.concatenate([graph.flops for graph, _ in steps])
    nbytes = np.concatenate([graph.bytes_accessed for graph, _ in steps])
    keep = np.isfinite(measured) & (measured > 0)
    launch_only = keep & (work < _LAUNCH_ONLY_S) & ((flops > 0) | (nbytes > 0))
    launch = float(np.median(measured[launch_only])) if launch_only.any() else gpu.launch_overhead_s
    calibrated = dataclasses.replace(gpu, launch_overhead_s=min(launch, 0.5))
    try:
        fit = fit_efficiencies(flops[keep], nbytes[keep], measured[keep], calibrated, dtype=dtype)
    except ValueError:
        return None
    # the cost model takes efficiencies in (0, 4]; the grid's refinement can step just past its bound
    return {**fit._asdict(), "launch_overhead_s": calibrated.launch_overhead_s,
            "compute_efficiency": min(fit.compute_efficiency, 4.0), "memory_efficiency": min(fit.memory_efficiency, 4.0)}
