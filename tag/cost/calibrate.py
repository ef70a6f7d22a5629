"""Check the roofline against measured op times: rank correlation and fitted efficiency factors."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from tag.cluster.gpus import GPUType, gpu_type
from tag.cost.compute import CostModel
from tag.graph.opgraph import ROLE_BACKWARD, ROLE_FORWARD, ROLES, OpGraph

__all__ = ["spearman", "rankdata", "EfficiencyFit", "fit_efficiencies", "measured_samples", "profile_agreement"]


def rankdata(values: np.ndarray) -> np.ndarray:
    """[K] ranks 1..K of ``values`` [K], ties given their average rank (as scipy.stats.rankdata)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Group equal values: each run of ties gets the mean of the positions it spans.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    average = (starts + ends + 1) / 2.0  # mean of 1-based positions start+1 .. end
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of ``x`` and ``y`` [K] (Pearson of average ranks); NaN if either is constant."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"spearman: x has {x.size} values, y has {y.size}")
    if x.size < 2:
        return float("nan")
    rx, ry = rankdata(x) - (x.size + 1) / 2.0, rankdata(y) - (y.size + 1) / 2.0
    denominator = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / denominator) if denominator > 0 else float("nan")


class EfficiencyFit(NamedTuple):
    compute_efficiency: float
    memory_efficiency: float
    rms_log_error: float  # root mean square of ln(predicted / measured) at the fit
    samples: int


def _log_residuals(flops, nbytes, measured, peak, bandwidth, overhead, compute, memory) -> np.ndarray:
    """[..., K] ln(predicted / measured) for efficiency grids ``compute`` [..., 1], ``memory`` [..., 1]."""
    predicted = overhead + np.maximum(flops / (peak * compute), nbytes / (bandwidth * memory))
    return np.log(predicted) - np.log(measured)


def fit_efficiencies(flops: np.ndarray, bytes_accessed: np.ndarray, measured: np.ndarray, gpu: GPUType | str, *,
                     dtype: str = "fp32", bounds: tuple[float, float] = (0.01, 4.0)) -> EfficiencyFit:
    """Least squares in log space of the roofline's two efficiencies against measured times.

    ``flops``, ``bytes_accessed``, ``measured`` (seconds): [K]; samples with a measured time of 0 or no
    cost are dropped. The objective is not smooth (a max), so a log grid over ``bounds`` is searched
    and then refined around its best cell. Efficiencies above 1 are allowed: cuDNN's Winograd and FFT
    convolutions do fewer FLOPs than the direct count the graph records.
    """
    gpu = gpu if isinstance(gpu, GPUType) else gpu_type(gpu)
    flops, nbytes, measured = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (flops, bytes_accessed, measured))
    keep = (measured > 0) & ((flops > 0) | (nbytes > 0)) & np.isfinite(measured)
    flops, nbytes, measured = flops[keep], nbytes[keep], measured[keep]
    if measured.size == 0:
        raise ValueError("fit_efficiencies: no sample has both a measured time and a cost")
    args = (flops, nbytes, measured, gpu.peak(dtype), gpu.memory_bandwidth, gpu.launch_overhead_s)
    low, high = np.log(bounds[0]), np.log(bounds[1])
    compute_grid = memory_grid = np.exp(np.linspace(low, high, 121))
    step = (high - low) / 120
    for _ in range(3):
        c, m = np.meshgrid(compute_grid, memory_grid, indexing="ij")
        loss = (_log_residuals(*args, c[..., None], m[..., None]) ** 2).mean(axis=-1)  # [Gc, Gm]
        i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
        best_c, best_m = compute_grid[i], memory_grid[j]
        compute_grid = best_c * np.exp(np.linspace(-step, step, 41))
        memory_grid = best_m * np.exp(np.linspace(-step, step, 41))
        step /= 20
    rms = float(np.sqrt(loss[i, j]))
    return EfficiencyFit(float(best_c), float(best_m), rms, int(measured.size))


def measured_samples(graph: OpGraph, role: int | None = None) -> np.ndarray:
    """[K] ops with a positive measured time (of ``role``; else forward and backward ops).

    PipeDream times modules only: its functional ops (Add, Concat, views) read 0 ms and are left out.
    """
    roles = (ROLE_FORWARD, ROLE_BACKWARD) if role is None else (role,)
    with np.errstate(invalid="ignore"):
        positive = graph.measured_time > 0
    return np.flatnonzero(np.isin(graph.role, roles) & positive)


def profile_agreement(graph: OpGraph, *, cost_model: CostModel | None = None,
                      gpu: GPUType | str | None = None) -> dict[str, dict[str, float]]:
    """Roofline predictions (measured times ignored) against a profile's measured times, per role.

    ``gpu`` defaults to ``graph.meta["measured_on"]``. Returns ``{"forward": {"samples", "spearman",
    "median_ratio"}, "backward": {...}}``, median_ratio = median of predicted / measured.
    """
    model = CostModel() if cost_model is None else cost_model
    gpu = gpu if gpu is not None else graph.meta.get("measured_on")
    if gpu is None:
        raise ValueError("profile_agreement: the graph does not say which GPU it was measured on; pass gpu=")
    predicted = dataclasses.replace(model, use_measured=False).op_times(graph, gpu)
    out: dict[str, dict[str, float]] = {}
    for role in (ROLE_FORWARD, ROLE_BACKWARD):
        ops = measured_samples(graph, role)
        measured = graph.measured_time[ops]
        out[ROLES[role]] = {
            "samples": int(ops.size),
            "spearman": spearman(predicted[ops], measured),
            "median_ratio": float(np.median(predicted[ops] / measured)) if ops.size else float("nan"),
        }
    return out
