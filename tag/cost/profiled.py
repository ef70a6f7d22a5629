"""A cost model that reads measured op times from a profile where it has them.

``tag profile`` times every op of a train step on a device and fits TAG's linear model in the batch
(:mod:`tag.profile.data`). :class:`ProfiledCostModel` uses those fits for a graph whose structure the
profile measured on the GPU type asked about, in the cost model's dtype; another graph on a GPU type the
profile measured gets the roofline calibrated to the profile (the measured per-op launch floor and the
efficiencies fitted under it, ``roofline_fit``), and every other GPU type the roofline of
:class:`~tag.cost.compute.CostModel` unchanged. It is an ordinary cost model
object, passed to the planners like any other (no global state), and equal to another only when its
profile is (so the compiler's caches keep them apart).

A graph that sufficient-factor broadcasting rewrote (ops duplicated) is another structure, so its times
come from the roofline: plan with ``--no-sfb`` where the measured times should decide (``tag run`` does
not run SFB plans either).
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from dataclasses import dataclass, field

import numpy as np

from tag.cluster.gpus import GPUType, gpu_type
from tag.cost.compute import CostModel
from tag.graph.opgraph import ROLE_INPUT, OpGraph
from tag.profile.data import ModelTimes, Profile

__all__ = ["ProfiledCostModel"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfiledCostModel(CostModel):
    """Measured times (``profile``) where the profile covers the graph and GPU type; the roofline elsewhere."""

    profile: Profile | None = None  # None: a plain roofline model
    # graph -> its ModelTimes per GPU name (None where not covered); structure hashes are not free
    _matches: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, init=False,
                                                compare=False, hash=False, repr=False)

    def measured(self, graph: OpGraph, gpu: GPUType | str) -> ModelTimes | None:
        """The profile's times for ``graph`` on ``gpu``, or None where the roofline applies."""
        if self.profile is None or not self.use_measured:
            return None
        name = gpu.name if isinstance(gpu, GPUType) else gpu_type(gpu).name
        per_graph = self._matches.setdefault(graph, {})
        if name not in per_graph:
            device = self.profile.device(name)
            times = device.match(graph) if device is not None and device.dtype == self.dtype else None
            per_graph[name] = times if times is not None and times.num_ops == graph.num_ops else None
            if device is not None and per_graph[name] is None:
                log.warning("the profile measured %s but not this step of %s (%d ops) in %s: its ops cost the "
                            "roofline's times there%s", name, graph.meta.get("model", "a model"), graph.num_ops,
                            self.dtype, ", calibrated to the profile" if device.roofline_fit else "")
        return per_graph[name]

    def __reduce__(self):
        """Pickled without the per-graph cache (weak references do not pickle; worker processes rebuild it)."""
        return (type(self), (self.compute_efficiency, self.memory_efficiency, self.dtype, self.use_measured,
                             self.profile))

    def covers(self, graph: OpGraph, gpu: GPUType | str) -> bool:
        return self.measured(graph, gpu) is not None

    def calibrated(self, gpu: GPUType | str) -> tuple[CostModel, GPUType] | None:
        """The roofline calibrated on ``gpu`` by the profile (launch overhead, efficiencies): a plain cost
        model and the GPU type with the measured launch overhead, plus the median per-op overhead of `tag
        run`'s executor over the profiled steps (0 for a GPU profile); None where the profile has none."""
        if self.profile is None or not self.use_measured:
            return None
        gpu = gpu if isinstance(gpu, GPUType) else gpu_type(gpu)
        device = self.profile.device(gpu.name)
        fit = device.roofline_fit if device is not None and device.dtype == self.dtype else None
        if not fit or "launch_overhead_s" not in fit:
            return None
        model = CostModel(compute_efficiency=fit["compute_efficiency"], memory_efficiency=fit["memory_efficiency"],
                          dtype=self.dtype, use_measured=self.use_measured)
        executor = float(np.median([m.executor_overhead_s for m in device.models.values()])) if device.models else 0.0
        return model, dataclasses.replace(gpu, launch_overhead_s=min(fit["launch_overhead_s"] + executor, 0.999))

    def reference_times(self, graph: OpGraph, gpu: GPUType | str) -> np.ndarray:
        times = self.measured(graph, gpu)
        if times is not None:
            fixed, scaled = _linear(graph, times)
            return fixed + scaled
        calibrated = self.calibrated(gpu)
        if calibrated is not None:
            model, device = calibrated
            return model.reference_times(graph, device)
        return super().reference_times(graph, gpu)

    def linear_times(self, graph: OpGraph, gpu: GPUType | str) -> tuple[np.ndarray, np.ndarray]:
        times = self.measured(graph, gpu)
        if times is not None:
            return _linear(graph, times)
        calibrated = self.calibrated(gpu)
        if calibrated is not None:
            model, device = calibrated
            return model.linear_times(graph, device)
        return super().linear_times(graph, gpu)


def _linear(graph: OpGraph, times: ModelTimes) -> tuple[np.ndarray, np.ndarray]:
    """([N] fixed, [N] scaled) seconds at the graph's batch (:meth:`ModelTimes.linear`); the graph says
    which ops scale with the batch (a trace by another torch can flag a few ops otherwise); inputs cost 0."""
    fixed, scaled = times.linear(graph.batch_size, graph.batch_scaled)
    inputs = graph.role == ROLE_INPUT
    return np.where(inputs, 0.0, fixed), np.where(inputs, 0.0, scaled)
