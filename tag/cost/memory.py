"""Training memory of a whole graph on one device: does it fit?

What it counts (fp32 sizes as the graph records them):

- parameters: ``graph.param_bytes`` summed (P);
- gradients: one more P;
- optimizer state: Adam's first and second moments, 2·P (SGD with momentum P, plain SGD 0), so fp32
  Adam holds 4·P in all;
- activations kept for backward: the outputs of forward and input ops that some backward op consumes,
  at ``batch_fraction`` of the reference batch (batch-scaled ops only). For a traced graph these are
  exactly the saved tensors; for a PipeDream graph, every layer's output (each feeds its own backward).

Not counted: transient workspace (cuDNN), the gradient of the activation being computed, the CUDA
context and allocator fragmentation, which the simulator's reference counting covers op by op.
"""

from __future__ import annotations

import numpy as np

from tag.cluster.gpus import GPUType, gpu_type
from tag.graph.opgraph import ROLE_BACKWARD, ROLE_FORWARD, ROLE_INPUT, OpGraph

__all__ = ["OPTIMIZER_STATE_COPIES", "training_memory_breakdown", "training_memory_bytes", "fits"]

# Copies of the parameters each optimizer keeps as state.
OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


def _kept_for_backward(graph: OpGraph) -> np.ndarray:
    """[N] bool: forward or input ops whose output some backward op reads."""
    src_role = graph.role[graph.edge_src]
    feeds = ((src_role == ROLE_FORWARD) | (src_role == ROLE_INPUT)) & (graph.role[graph.edge_dst] == ROLE_BACKWARD)
    # Parameters and optimizer state are inputs too, but they are counted as such, not as activations.
    stateful = (graph.role == ROLE_INPUT) & (
        (graph.param_bytes > 0) | np.array([k in ("parameter", "optimizer_state") for k in graph.kinds], dtype=bool))
    feeds &= ~stateful[graph.edge_src]
    kept = np.zeros(graph.num_ops, dtype=bool)
    kept[graph.edge_src[feeds]] = True
    return kept


def training_memory_breakdown(graph: OpGraph, *, optimizer: str = "adam", batch_fraction: float = 1.0) -> dict[str, float]:
    """Bytes by category: parameters, gradients, optimizer_state, activations, total."""
    if optimizer not in OPTIMIZER_STATE_COPIES:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {', '.join(OPTIMIZER_STATE_COPIES)}")
    if not batch_fraction >= 0:
        raise ValueError(f"batch_fraction must be non-negative, got {batch_fraction!r}")
    params = graph.total_param_bytes()
    kept = _kept_for_backward(graph)
    scale = np.where(graph.batch_scaled, batch_fraction, 1.0)
    activations = float((graph.output_bytes * scale)[kept].sum())
    parts = {
        "parameters": params,
        "gradients": params,
        "optimizer_state": OPTIMIZER_STATE_COPIES[optimizer] * params,
        "activations": activations,
    }
    parts["total"] = sum(parts.values())
    return parts


def training_memory_bytes(graph: OpGraph, *, optimizer: str = "adam", batch_fraction: float = 1.0) -> float:
    """Parameters + gradients + optimizer state + activations kept for backward (module docstring)."""
    return training_memory_breakdown(graph, optimizer=optimizer, batch_fraction=batch_fraction)["total"]


def fits(graph: OpGraph, gpu: GPUType | str, *, optimizer: str = "adam", batch_fraction: float = 1.0) -> bool:
    """Whether one device of type ``gpu`` holds the whole training step's memory."""
    gpu = gpu if isinstance(gpu, GPUType) else gpu_type(gpu)
    return training_memory_bytes(graph, optimizer=optimizer, batch_fraction=batch_fraction) <= gpu.memory_bytes
