"""Random TaskGraphs, for testing the simulators against each other and for benchmarks."""

from __future__ import annotations

import numpy as np

from tag._rng import as_rng
from tag.cluster import Cluster
from tag.sim.taskgraph import COLLECTIVES, TaskGraph, TaskGraphBuilder

__all__ = ["random_taskgraph"]

_GB = 1e9


def _duration(rng: np.random.Generator, tie_fraction: float, scale: float) -> float:
    """Continuous most of the time; sometimes 0 or a small whole number of ``scale``, to provoke ties."""
    draw = rng.random()
    if draw < tie_fraction / 3:
        return 0.0
    if draw < tie_fraction:
        return float(rng.integers(1, 4)) * scale
    return float(rng.uniform(0.05, 2.0)) * scale


def random_taskgraph(cluster: Cluster, num_tasks: int, *, seed: int | np.random.Generator | None = 0,
                     p_transfer: float = 0.25, p_collective: float = 0.08, max_deps: int = 3, window: int = 24,
                     tie_fraction: float = 0.2, num_groups: int = 8, tensors: bool = True,
                     scale: float = 0.1) -> TaskGraph:
    """A random DAG of ``num_tasks`` tasks on ``cluster`` mixing compute, transfers (0 B to 1 GB) and
    collectives, each depending on up to ``max_deps`` of the ``window`` tasks before it in a hidden
    topological order (task ids are shuffled, so id order is not topological). ``tie_fraction`` of the
    durations are 0 or whole multiples of ``scale`` seconds, so that many events coincide. With
    ``tensors``, every task produces a tensor read by some of its successors, some tensors have no
    producer, and each device holds persistent bytes."""
    rng = as_rng(seed)
    num_devices = cluster.num_devices
    hidden_id = rng.permutation(num_tasks)  # position in the hidden topological order -> task id
    position = np.argsort(hidden_id)  # task id -> position
    kinds = rng.choice(3, size=num_tasks, p=[1 - p_transfer - p_collective, p_transfer, p_collective])
    if num_devices < 2:
        kinds[kinds == 1] = 0
    deps_at: list[list[int]] = []  # position -> positions it depends on
    for p in range(num_tasks):
        low = max(0, p - window)
        count = min(p - low, int(rng.integers(0, max_deps + 1)))
        deps_at.append(sorted(rng.choice(np.arange(low, p), size=count, replace=False).tolist()) if count else [])
    builder = TaskGraphBuilder(cluster, num_groups=num_groups)
    for task in range(num_tasks):
        p = int(position[task])
        group = int(rng.integers(-1, num_groups))
        label = f"p{p}"
        if kinds[p] == 0:
            builder.compute(int(rng.integers(num_devices)), _duration(rng, tie_fraction, scale), group=group,
                            label=label)
        elif kinds[p] == 1:
            src, dst = rng.choice(num_devices, size=2, replace=False).tolist()
            draw = rng.random()
            nbytes = 0.0 if draw < 0.05 else float(rng.integers(1, 10)) * 1e8 if draw < 0.3 else float(rng.uniform(1e6, _GB))
            builder.transfer(src, dst, nbytes, group=group, label=label)
        else:
            size = int(rng.integers(1, min(num_devices, 4) + 1))
            members = rng.choice(num_devices, size=size, replace=False).tolist()
            builder.collective(members, _duration(rng, tie_fraction, scale), op=COLLECTIVES[int(rng.integers(4))],
                               nbytes=float(rng.uniform(0, _GB)), group=group, label=label)
    for task in range(num_tasks):
        builder.add_deps(task, [int(hidden_id[q]) for q in deps_at[int(position[task])]])
    if tensors:
        _random_tensors(builder, rng, hidden_id, deps_at)
    return builder.build()


def _random_tensors(builder: TaskGraphBuilder, rng: np.random.Generator, hidden_id: np.ndarray,
                    deps_at: list[list[int]]) -> None:
    num_tasks = len(hidden_id)
    successors: list[list[int]] = [[] for _ in range(num_tasks)]  # task id -> successor task ids
    for p, deps in enumerate(deps_at):
        for q in deps:
            successors[int(hidden_id[q])].append(int(hidden_id[p]))
    touched = [set(builder.devices_of(task)) for task in range(num_tasks)]
    for task in range(num_tasks):
        device = int(rng.choice(sorted(touched[task])))
        readers = [s for s in successors[task] if device in touched[s] and rng.random() < 0.7]
        builder.tensor(device, float(rng.integers(1, 1000)) * 1e6, producer=task, consumers=readers)
        if rng.random() < 0.05:  # an input batch: live from time 0 until read
            builder.tensor(device, float(rng.integers(1, 100)) * 1e6, consumers=[task])
    for device in range(builder.cluster.num_devices):
        builder.tensor(device, float(rng.integers(1, 1000)) * 1e6, persistent=True)
