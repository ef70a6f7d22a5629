"""Merging chunk tasks: one task per run of chunks, with dependency and tensor lags.

The compiler cuts a group's ops into *chunks* at its boundary tensors (:mod:`tag.compiler.tables`), so that a
boundary tensor leaves when the op producing it ends and a chunk starts when the tensor its first op reads
arrives. :func:`merge_taskgraph` runs the chunks of one part on one device as one task instead, and keeps
those instants as **lags** (seconds after a task's start; :class:`tag.sim.taskgraph.Lags`): a chunk's
output is released where the chunk ends inside the merged task, and a merged task may start as early as
``release - offset`` of every input, ``offset`` being where the reading chunk starts inside it (never
before the producer starts). Tensors keep their chunk's lifetime. Both simulators honour lags, so a merged
graph runs the same work with fewer tasks; what it loses is the chance for other tasks to slip in between
the chunks of one merged task (strict FIFO between chunks becomes no pre-emption inside a task).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tag.sim.kernels import merge_chunks
from tag.sim.taskgraph import TaskGraph

__all__ = ["merge_taskgraph", "pairs_csr"]


def merge_taskgraph(taskgraph: TaskGraph, merge_key: np.ndarray) -> tuple[TaskGraph, np.ndarray]:
    """(merged TaskGraph, new id [T] of each task): the tasks of ``taskgraph`` (unmerged: no lags) that share
    a ``merge_key`` [T] (>= 0; -1: a task of its own) become one task each, its chunks back to back in task
    order (they must hold the same one resource, and be listed in a topological order). New tasks are numbered
    by their first chunk and keep its name, label and columns. See :func:`tag.sim.kernels.merge_chunks`."""
    tg = taskgraph
    merge_key = np.asarray(merge_key, dtype=np.int64)
    if merge_key.shape != (tg.num_tasks,):
        raise ValueError(f"merge_taskgraph: merge_key has shape {merge_key.shape}, expected ({tg.num_tasks},)")
    dep_task = np.repeat(np.arange(tg.num_tasks), np.diff(tg.dep_ptr))
    read_tensor = np.repeat(np.arange(tg.num_tensors), np.diff(tg.consumer_ptr))
    num_keys = int(merge_key.max()) + 1 if merge_key.size else 0
    (new_id, _, _, first, duration, kind, group, res_ptr, res, dep_task, dep_on, dep_lag, producer, alloc_lag,
     free_lag, read_task, read_lag) = merge_chunks(merge_key, num_keys, tg.duration, tg.kind, tg.group, tg.res_ptr,
                                                   tg.res, dep_task, tg.dep, tg.tensor_producer, read_tensor,
                                                   tg.consumer)
    num_tasks = duration.size
    dep_ptr, dep, dep_lag = pairs_csr(dep_task, dep_on, num_tasks, num_tasks, dep_lag)
    consumer_ptr, consumer, consumer_lag = pairs_csr(read_tensor, read_task, tg.num_tensors, num_tasks, read_lag)
    names = [tg.names[t] for t in first.tolist()]
    labels = [tg.labels[t] for t in first.tolist()]
    merged = dataclasses.replace(
        tg, names=names, labels=labels, kind=kind, duration=duration, device=tg.device[first], peer=tg.peer[first],
        nbytes=tg.nbytes[first], collective=tg.collective[first], group=group, dep_ptr=dep_ptr, dep=dep,
        res_ptr=res_ptr, res=res, tensor_producer=producer, consumer_ptr=consumer_ptr, consumer=consumer,
        num_groups=tg.num_groups, dep_lag=dep_lag, tensor_alloc_lag=alloc_lag, tensor_free_lag=free_lag,
        consumer_lag=consumer_lag)
    return merged, new_id


def pairs_csr(keys, values, size: int, stride: int, lags: np.ndarray | None = None):
    """(ptr [size+1], values, lags) of the pairs (keys[k], values[k]) with keys < size and values < stride,
    duplicates dropped (the largest of their ``lags`` kept; lags None: None), values ascending per key."""
    stride = max(stride, 1)
    code = np.asarray(keys, dtype=np.int64) * stride + np.asarray(values, dtype=np.int64)
    if lags is None:
        pair, kept = np.unique(code), None
    else:
        lags = np.asarray(lags, dtype=np.float64)
        order = np.lexsort((-lags, code))  # by pair, the largest lag first
        code, lags = code[order], lags[order]
        first = np.ones(code.size, dtype=bool)
        first[1:] = code[1:] != code[:-1]
        pair, kept = code[first], lags[first]
    ptr = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.bincount(pair // stride, minlength=size), out=ptr[1:])
    return ptr, pair % stride, kept
