"""Op compute times on a GPU type: a roofline, or a measured time moved to another GPU by the roofline.

TAG §4.1.2 profiles every op on every GPU type and fits a linear model in the batch size; where no
device is at hand we predict instead (DESIGN "Cost model"):

    t(op, gpu, 1) = launch + max(FLOPs / (peak · compute_efficiency), bytes / (bandwidth · memory_efficiency))

at the reference batch, and for a batch-scaled op run on a fraction ``f`` of it, TAG's linear model in
the batch: t(f) = fixed + f · (t(1) − fixed), where the fixed part is the launch overhead plus the
bytes that do not shrink with the batch (weights read, weight gradients written:
:meth:`OpGraph.fixed_bytes`) at the memory roofline, at most t(1). A GEMM on a micro-batch of 8 rows
still reads its whole weight matrix; this line is the chord of the roofline between f → 0 (the weight
reads) and f = 1, so it never underestimates it. Ops that are not batch-scaled, such as optimizer
updates, cost the same at every ``f``. Ops with neither FLOPs nor bytes (views, sizes) and input ops
launch no kernel and cost 0.

Measured times (PipeDream profiles): on the GPU they were measured on (``graph.meta["measured_on"]``,
in ``graph.meta["measured_dtype"]``, default fp32) an op costs its measured time; on another GPU or
dtype, the measured time times the ratio of the two roofline predictions (overhead included), so a
profile keeps its per-layer detail and the roofline only supplies the relative speed. A graph whose
``measured_on`` is ``None`` keeps measured times for reference only; they are then ignored.

Default efficiencies (compute 0.7, memory 0.5): ``scripts/check_cost_model.py`` fits the two factors to
the three PipeDream profiles (V100, fp32; least squares of ln(predicted/measured) over every measured
forward and backward layer) and gets about 0.86 and 0.43, rms log error 0.71; the defaults reach 0.73
with a median predicted/measured ratio near 1. The fitted compute factor is inflated by cuDNN's
Winograd 3×3 convolutions, which do fewer FLOPs than the direct count the graph records (VGG16's deep
convolutions run at 20–40 "direct" TFLOP/s on a 15.7 TFLOP/s V100; its 1×1 convolutions and GEMMs at
60–75 % of peak), and the memory factor is deflated by the per-layer overhead of the PipeDream profiler
on small forward layers (backward layers alone fit ≈ 0.7). The defaults keep both factors physical:
70 % of peak is what cuBLAS/cuDNN reach on large fp32 GEMMs and direct convolutions, 50 % of the
datasheet bandwidth what framework-level element-wise and normalisation kernels reach on average.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tag.cluster.gpus import DTYPES, GPUType, gpu_type
from tag.graph.opgraph import ROLE_INPUT, OpGraph

__all__ = ["CostModel", "roofline_time", "DEFAULT_COMPUTE_EFFICIENCY", "DEFAULT_MEMORY_EFFICIENCY"]

# Fitted on the PipeDream profiles, rounded (see the module docstring and scripts/check_cost_model.py).
DEFAULT_COMPUTE_EFFICIENCY = 0.7
DEFAULT_MEMORY_EFFICIENCY = 0.5


def roofline_time(flops, bytes_accessed, peak_flops: float, memory_bandwidth: float, *,
                  compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY,
                  memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY, launch_overhead: float = 0.0):
    """launch + max(FLOPs / (peak · eff_c), bytes / (bandwidth · eff_m)); 0 where both are 0.

    ``flops`` and ``bytes_accessed`` are scalars or arrays of one shape; returns the same shape.
    """
    flops = np.asarray(flops, dtype=np.float64)
    nbytes = np.asarray(bytes_accessed, dtype=np.float64)
    busy = np.maximum(flops / (peak_flops * compute_efficiency), nbytes / (memory_bandwidth * memory_efficiency))
    out = np.where((flops > 0) | (nbytes > 0), launch_overhead + busy, 0.0)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class CostModel:
    """Roofline op times with efficiency factors (fractions of the datasheet peaks)."""

    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY  # of peak FLOP/s, fitted (module docstring)
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY  # of memory bandwidth, fitted
    dtype: str = "fp32"  # which peak FLOP/s to use (tensor cores for fp16/bf16/tf32)
    use_measured: bool = True  # use a graph's measured times where it has them

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value <= 4):
                raise ValueError(f"CostModel.{name} must be in (0, 4], got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"CostModel.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    def roofline(self, graph: OpGraph, gpu: GPUType | str) -> np.ndarray:
        """[N] predicted seconds at the reference batch, measured times ignored."""
        gpu = _resolve(gpu)
        times = roofline_time(graph.flops, graph.bytes_accessed, gpu.peak(self.dtype), gpu.memory_bandwidth,
                              compute_efficiency=self.compute_efficiency, memory_efficiency=self.memory_efficiency,
                              launch_overhead=gpu.launch_overhead_s)
        times = np.atleast_1d(times)
        times[graph.role == ROLE_INPUT] = 0.0
        return times

    def reference_times(self, graph: OpGraph, gpu: GPUType | str) -> np.ndarray:
        """[N] seconds at the reference batch: measured (moved to ``gpu``) where known, else roofline."""
        gpu = _resolve(gpu)
        predicted = self.roofline(graph, gpu)
        measured_on = graph.meta.get("measured_on")
        measured = graph.measured_time
        if not self.use_measured or measured_on is None or np.isnan(measured).all():
            return predicted
        reference = gpu_type(measured_on)
        measured_dtype = graph.meta.get("measured_dtype", "fp32")
        known = ~np.isnan(measured) & (graph.role != ROLE_INPUT)
        if reference == gpu and measured_dtype == self.dtype:
            return np.where(known, measured, predicted)
        at_reference = dataclasses.replace(self, dtype=measured_dtype).roofline(graph, reference)
        ratio = np.divide(predicted, at_reference, out=np.ones_like(predicted), where=at_reference > 0)
        return np.where(known, measured * ratio, predicted)

    def linear_times(self, graph: OpGraph, gpu: GPUType | str) -> tuple[np.ndarray, np.ndarray]:
        """([N] fixed, [N] scaled) seconds: an op on fraction f of the reference batch takes fixed + f·scaled
        (module docstring). Fixed, for a batch-scaled op: the launch overhead plus its fixed bytes
        (:meth:`OpGraph.fixed_bytes`, weights read and weight gradients written) at the memory roofline,
        at most its whole time; for an op that does not scale, its whole time (scaled 0)."""
        gpu = _resolve(gpu)
        full = self.reference_times(graph, gpu)
        weights = graph.fixed_bytes() / (gpu.memory_bandwidth * self.memory_efficiency)
        fixed = np.where(graph.batch_scaled & (full > 0), np.minimum(gpu.launch_overhead_s + weights, full), full)
        return fixed, full - fixed

    def fixed_times(self, graph: OpGraph, gpu: GPUType | str) -> np.ndarray:
        """[N] seconds of each op that do not shrink with its batch fraction (:meth:`linear_times`)."""
        return self.linear_times(graph, gpu)[0]

    def op_times(self, graph: OpGraph, gpu: GPUType | str, batch_fraction: float | np.ndarray = 1.0) -> np.ndarray:
        """[N] seconds of each op on ``gpu`` run on ``batch_fraction`` (scalar or [N]) of the reference batch:
        fixed + fraction · scaled (:meth:`linear_times`)."""
        fraction = np.asarray(batch_fraction, dtype=np.float64)
        if (fraction < 0).any() or not np.isfinite(fraction).all():
            raise ValueError("batch_fraction must be finite and non-negative")
        fixed, scaled = self.linear_times(graph, gpu)
        return fixed + np.broadcast_to(fraction, fixed.shape) * scaled

    def op_time_table(self, graph: OpGraph, gpus: Sequence[GPUType | str]) -> np.ndarray:
        """[N, T] seconds of each op on each GPU type at the reference batch."""
        if len(gpus) == 0:
            return np.zeros((graph.num_ops, 0))
        return np.stack([self.op_times(graph, gpu) for gpu in gpus], axis=1)


def _resolve(gpu: GPUType | str) -> GPUType:
    return gpu if isinstance(gpu, GPUType) else gpu_type(gpu)
