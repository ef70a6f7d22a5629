"""Gradient buckets of pipeline stages: what lets a stage's all-reduce overlap its last backward pass.

Data parallelism (DDP, and tag's DP baselines) all-reduces a layer's gradient as soon as the backward
pass has produced it, so communication runs under the rest of the backward pass. A pipeline stage with
gradient accumulation can do the same during its *last* backward pass (the earlier micro-batches only
accumulate). :func:`gradient_buckets` cuts each stage's backward pass into pieces for that: the stage's
forward nodes in reverse topological order (the order the backward pass visits them), a piece closing
at every node that holds parameters, whose gradient is then final. Piece k of a stage carries

- the backward seconds of its nodes (per micro-batch share of one replica, on every GPU type);
- the gradient bytes of the node that closes it (all-reduced over the stage's replicas after the piece);
- the optimizer seconds of that node (its update, once the all-reduce and the backward pass are done:
  an update never delays the backward pass, whose end the previous stage waits for).

Nodes after the last parameter node (in backward order: the input side of the stage) form a last piece
with no gradient. The pieces' times sum to the stage's backward time, their bytes to its parameters.
The pipeline compiler (:func:`tag.exact.compile_pipeline`) runs them as one chain in place of the
stage's last backward task, with one all-reduce and one optimizer task per piece that has bytes; a
stage graph without buckets (built by hand) keeps one all-reduce after its last backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GradientBuckets", "gradient_buckets"]


@dataclass(frozen=True)
class GradientBuckets:
    """K backward pieces of S stages, stage-major, each stage's pieces in the order its backward runs them."""

    stage: np.ndarray  # [K] stage of each piece (non-decreasing)
    backward_time: np.ndarray  # [K, T] seconds per micro-batch share of one replica
    nbytes: np.ndarray  # [K] gradient bytes final after the piece (0: none)
    optimizer_time: np.ndarray  # [K, T] seconds of the update of those gradients

    def of_stage(self, s: int) -> np.ndarray:
        """Piece ids of stage ``s``, in backward order."""
        return np.flatnonzero(self.stage == s)


def gradient_buckets(forward_stage: np.ndarray, node_backward: np.ndarray, param_bytes: np.ndarray,
                     optimizer_time: np.ndarray) -> GradientBuckets:
    """Buckets of every stage (module docstring).

    ``forward_stage`` [F] stage of each forward node (nodes in topological order), ``node_backward``
    [F, T] each node's backward seconds at its stage's micro-batch share, ``param_bytes`` [F],
    ``optimizer_time`` [F, T].
    """
    forward_stage = np.asarray(forward_stage, dtype=np.int64)
    num_nodes = forward_stage.size
    # backward order: stage by stage, within a stage from the last node to the first
    order = np.lexsort((-np.arange(num_nodes), forward_stage))  # [F]
    stage_sorted = forward_stage[order]
    closes = param_bytes[order] > 0
    # a node's piece: the number of parameter nodes of its stage strictly before it in backward order
    first_of_stage = np.r_[True, stage_sorted[1:] != stage_sorted[:-1]]
    closed_before = np.cumsum(closes) - closes  # [F] parameter nodes before, over all stages
    stage_base = np.maximum.accumulate(np.where(first_of_stage, closed_before, 0))
    local = closed_before - stage_base  # [F] piece index within the stage
    # give every (stage, local piece) a global id; a stage's trailing nodes form one more piece
    key = stage_sorted * (num_nodes + 1) + local
    keys, piece = np.unique(key, return_inverse=True)
    num_pieces = keys.size
    weights = np.zeros(num_pieces)
    np.add.at(weights, piece, np.where(closes, param_bytes[order], 0.0))
    backward = np.zeros((num_pieces, node_backward.shape[1]))
    np.add.at(backward, piece, node_backward[order])
    optimizer = np.zeros((num_pieces, optimizer_time.shape[1]))
    np.add.at(optimizer, piece, optimizer_time[order])
    return GradientBuckets(stage=keys // (num_nodes + 1), backward_time=backward, nbytes=weights,
                           optimizer_time=optimizer)
