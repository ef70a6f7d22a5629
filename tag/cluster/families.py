"""Topology families: random clusters of every kind the presets stand for, for training and judging the
learned planners on more than TAG's generator.

A family draws a cluster from a seed. Seeds of different families are independent streams (the generator
is seeded with ``(family index, seed)``), and the seed ranges of training, evaluation and validation
(``tag.training.config``) are shared by all families. Sizes stay where a placement search is cheap:
2–32 devices. ``family_cluster(family, seed, devices=D)`` draws a cluster of exactly D devices instead
(for the stage-to-device mapper, 8–256 devices): the same kinds of machines and links, as many as D
needs, from a stream of its own (``(family index, seed, D)``), so the unsized draws stay as they are.

| family | what |
| --- | --- |
| ``tag-random`` | TAG §5.2: 1–6 machines of 1–8 V100/1080Ti/P100, 64–160 / 20–50 Gbps |
| ``nvlink`` | DGX-like machines: 8 V100 in DGX-1's hybrid cube-mesh, 4 in an NVLink quad, or NVLink pairs over PCIe |
| ``mixed-gen`` | machines of different GPU generations (P100 to H100), NVLink where the GPU has it, PCIe otherwise |
| ``mesh`` | 2D and 3D meshes, bandwidth by hop count (Parmesan Table IX); sized: the squarest 2D grid |
| ``torus`` | 2D and 3D tori; sized: the squarest 2D torus |
| ``random-blk-1`` / ``random-blk-2`` / ``uniform-dist`` | Parmesan's look-up tables |

``HELD_OUT`` families are never drawn by training: the evaluation judges transfer on them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tag.cluster.build import INTRA_LATENCY_S, NETWORK_LATENCY_S, Link, Machine, build_cluster
from tag.cluster.cluster import Cluster
from tag.cluster.generators import (TAG_RANDOM_GPUS, grid_cluster, random_blk_1, random_blk_2, random_node_sizes,
                                    tag_random, uniform_dist)
from tag.cluster.presets import DGX1_NVLINK_DOUBLE, DGX1_NVLINK_SINGLE
from tag.errors import ClusterError

__all__ = ["FAMILIES", "HELD_OUT", "TRAIN_FAMILIES", "family_cluster", "squarest_grid"]

_GB = 1e9
_GBPS = 1e9 / 8

_NVLINK_LANE = 21.4 * _GB  # one V100 NVLink lane, each direction (DGX-1)
_PCIE = (8 * _GB, 12 * _GB)  # host PCIe between GPUs without a direct link
_NETWORK_GBPS = (10.0, 100.0)  # Ethernet / InfiniBand between machines

# GPU generations with the bandwidth between two GPUs of one machine (GB/s range; PCIe where no NVLink).
_GENERATIONS = (
    ("p100", _PCIE),
    ("1080ti", _PCIE),
    ("t4", _PCIE),
    ("titan-v", _PCIE),
    ("v100-16gb", (100 * _GB, 150 * _GB)),
    ("v100-32gb", (100 * _GB, 150 * _GB)),
    ("a100-40gb", (200 * _GB, 300 * _GB)),
    ("h100", (300 * _GB, 450 * _GB)),
)

_GRIDS = ((2, 2), (2, 3), (2, 4), (3, 3), (3, 4), (4, 4), (2, 8), (2, 2, 2), (2, 2, 3), (2, 2, 4), (2, 3, 3))
_LUT_DEVICES = (4, 24)  # look-up-table families: devices drawn from this range (inclusive)
_TAG_INTRA_GBPS = (64.0, 160.0)  # TAG §5.2's ranges (tag.cluster.generators.tag_random), for the sized draw
_TAG_INTER_GBPS = (20.0, 50.0)


def _nvlink_machine(m: int, base: int, rng: np.random.Generator) -> tuple[Machine, list[Link]]:
    """One DGX-like machine whose first global device is ``base``: a DGX-1 (8 V100, cube-mesh of single and
    double NVLinks), an NVLink quad (4 V100, every pair linked) or NVLink pairs (2 or 4 pairs over PCIe)."""
    pcie = float(rng.uniform(*_PCIE))
    kind = int(rng.integers(3))
    if kind == 0:
        links = [Link(base + a, base + b, _NVLINK_LANE) for a, b in DGX1_NVLINK_SINGLE]
        links += [Link(base + a, base + b, 2 * _NVLINK_LANE) for a, b in DGX1_NVLINK_DOUBLE]
        return Machine("v100-32gb", 8, pcie), links
    if kind == 1:
        lanes = 2 * _NVLINK_LANE
        return Machine("v100-16gb", 4, pcie), [Link(base + a, base + b, lanes)
                                              for a in range(4) for b in range(a + 1, 4)]
    pairs = int(rng.choice((2, 4)))
    lanes = float(rng.choice((1, 2, 4))) * _NVLINK_LANE
    gpu = ("v100-32gb", "a100-40gb")[int(rng.integers(2))]
    return Machine(gpu, 2 * pairs, pcie), [Link(base + 2 * p, base + 2 * p + 1, lanes) for p in range(pairs)]


def _nvlink(rng: np.random.Generator, name: str) -> Cluster:
    machines, links, base = [], [], 0
    for m in range(int(rng.integers(1, 5))):
        machine, inside = _nvlink_machine(m, base, rng)
        machines.append(machine)
        links += inside
        base += machine.count
    network = float(rng.uniform(*_NETWORK_GBPS)) * _GBPS
    return build_cluster(name, machines, network_bandwidth=network, network_latency=NETWORK_LATENCY_S, links=links)


def _mixed_generations(rng: np.random.Generator, name: str) -> Cluster:
    count = int(rng.integers(2, 6))
    chosen = rng.choice(len(_GENERATIONS), size=count, replace=True)
    if len(set(chosen.tolist())) == 1:  # a family of mixed generations: at least two
        chosen[-1] = (chosen[-1] + 1 + int(rng.integers(len(_GENERATIONS) - 1))) % len(_GENERATIONS)
    machines = []
    for g in chosen:
        gpu, intra = _GENERATIONS[int(g)]
        machines.append(Machine(gpu, int(rng.integers(1, 9)), float(rng.uniform(*intra)), INTRA_LATENCY_S))
    network = float(rng.uniform(*_NETWORK_GBPS)) * _GBPS
    return build_cluster(name, machines, network_bandwidth=network, network_latency=NETWORK_LATENCY_S)


def _grid(torus: bool) -> Callable[[np.random.Generator, str], Cluster]:
    def draw(rng: np.random.Generator, name: str) -> Cluster:
        shape = _GRIDS[int(rng.integers(len(_GRIDS)))]
        gpu = ("v100-32gb", "a100-40gb")[int(rng.integers(2))]
        return grid_cluster(shape, torus=torus, gpu=gpu, name=name)
    return draw


def _lut(build: Callable[..., Cluster]) -> Callable[[np.random.Generator, str], Cluster]:
    def draw(rng: np.random.Generator, name: str) -> Cluster:
        devices = int(rng.integers(_LUT_DEVICES[0], _LUT_DEVICES[1] + 1))
        return build(devices, seed=rng, name=name)
    return draw


FAMILIES: dict[str, Callable[[np.random.Generator, str], Cluster]] = {
    "tag-random": lambda rng, name: tag_random(seed=rng, name=name),  # family_cluster seeds it directly
    "nvlink": _nvlink,
    "mixed-gen": _mixed_generations,
    "mesh": _grid(False),
    "torus": _grid(True),
    "random-blk-1": _lut(random_blk_1),
    "random-blk-2": _lut(random_blk_2),
    "uniform-dist": _lut(uniform_dist),
}
HELD_OUT = ("torus", "random-blk-2")  # never drawn in training: the evaluation judges transfer on them
TRAIN_FAMILIES = tuple(f for f in FAMILIES if f not in HELD_OUT)


def family_cluster(family: str, seed: int, *, devices: int | None = None) -> Cluster:
    """The cluster of ``family`` drawn from ``seed`` (deterministic; families are independent streams);
    with ``devices``, one of exactly that many devices (module docstring)."""
    if family not in FAMILIES:
        raise ClusterError(f"unknown topology family {family!r} (known: {', '.join(FAMILIES)})")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ClusterError(f"a topology seed must be a non-negative integer, got {seed!r}")
    if devices is not None:
        if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 2:
            raise ClusterError(f"a sized family draw needs an integer number of devices >= 2, got {devices!r}")
        rng = np.random.default_rng([list(FAMILIES).index(family), int(seed), int(devices)])
        return _SIZED[family](rng, int(devices), f"{family}-{devices}-s{seed}")
    if family == "tag-random":  # TAG's own seeds: the clusters the shipped policy and its evaluations used
        return tag_random(seed=int(seed))
    rng = np.random.default_rng([list(FAMILIES).index(family), int(seed)])
    return FAMILIES[family](rng, f"{family}-s{seed}")


# --------------------------------------------------------------------------------------- sized draws


def _sized_tag_random(rng: np.random.Generator, devices: int, name: str) -> Cluster:
    """TAG §5.2's machines (1–8 GPUs of one type among TAG_RANDOM_GPUS, intra-machine bandwidth from
    U[64, 160] Gbps, one network bandwidth from U[20, 50] Gbps), as many as ``devices`` needs."""
    machines = [Machine(TAG_RANDOM_GPUS[int(rng.integers(len(TAG_RANDOM_GPUS)))], count,
                        float(rng.uniform(*_TAG_INTRA_GBPS)) * _GBPS, INTRA_LATENCY_S)
                for count in random_node_sizes(devices, rng)]
    network = float(rng.uniform(*_TAG_INTER_GBPS)) * _GBPS
    return build_cluster(name, machines, network_bandwidth=network, network_latency=NETWORK_LATENCY_S)


def _sized_nvlink(rng: np.random.Generator, devices: int, name: str) -> Cluster:
    """DGX-like machines (:func:`_nvlink_machine`) until ``devices``; where the drawn machine does not fit
    in what is left, a machine of NVLink pairs over PCIe takes the rest (a lone GPU when it is odd)."""
    machines, links, base = [], [], 0
    while base < devices:
        machine, inside = _nvlink_machine(len(machines), base, rng)
        room = devices - base
        if machine.count > room:
            lanes = float(rng.choice((1, 2, 4))) * _NVLINK_LANE
            machine = Machine("v100-32gb", room, float(rng.uniform(*_PCIE)))
            inside = [Link(base + 2 * p, base + 2 * p + 1, lanes) for p in range(room // 2)]
        machines.append(machine)
        links += inside
        base += machine.count
    network = float(rng.uniform(*_NETWORK_GBPS)) * _GBPS
    return build_cluster(name, machines, network_bandwidth=network, network_latency=NETWORK_LATENCY_S, links=links)


def _sized_mixed_generations(rng: np.random.Generator, devices: int, name: str) -> Cluster:
    """Machines of 1–8 GPUs, each of a generation drawn from _GENERATIONS (at least two of them when
    there are two machines or more), as many as ``devices`` needs."""
    sizes = random_node_sizes(devices, rng)
    chosen = rng.choice(len(_GENERATIONS), size=len(sizes), replace=True)
    if len(sizes) > 1 and len(set(chosen.tolist())) == 1:
        chosen[-1] = (chosen[-1] + 1 + int(rng.integers(len(_GENERATIONS) - 1))) % len(_GENERATIONS)
    machines = []
    for g, count in zip(chosen.tolist(), sizes):
        gpu, intra = _GENERATIONS[g]
        machines.append(Machine(gpu, count, float(rng.uniform(*intra)), INTRA_LATENCY_S))
    network = float(rng.uniform(*_NETWORK_GBPS)) * _GBPS
    return build_cluster(name, machines, network_bandwidth=network, network_latency=NETWORK_LATENCY_S)


def squarest_grid(devices: int) -> tuple[int, int]:
    """(rows, columns), rows <= columns, rows · columns = ``devices``, rows the largest such divisor."""
    rows = max(r for r in range(1, int(np.sqrt(devices)) + 1) if devices % r == 0)
    return rows, devices // rows


def _sized_grid(torus: bool) -> Callable[[np.random.Generator, int, str], Cluster]:
    def draw(rng: np.random.Generator, devices: int, name: str) -> Cluster:
        gpu = ("v100-32gb", "a100-40gb")[int(rng.integers(2))]
        return grid_cluster(squarest_grid(devices), torus=torus, gpu=gpu, name=name)
    return draw


def _sized_lut(build: Callable[..., Cluster]) -> Callable[[np.random.Generator, int, str], Cluster]:
    def draw(rng: np.random.Generator, devices: int, name: str) -> Cluster:
        return build(devices, seed=rng, name=name)
    return draw


_SIZED: dict[str, Callable[[np.random.Generator, int, str], Cluster]] = {
    "tag-random": _sized_tag_random,
    "nvlink": _sized_nvlink,
    "mixed-gen": _sized_mixed_generations,
    "mesh": _sized_grid(False),
    "torus": _sized_grid(True),
    "random-blk-1": _sized_lut(random_blk_1),
    "random-blk-2": _sized_lut(random_blk_2),
    "uniform-dist": _sized_lut(uniform_dist),
}
