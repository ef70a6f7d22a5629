"""Topology families: random clusters of every kind the presets stand for, for training and judging the
learned planners on more than TAG's generator.

A family draws a cluster from a seed. Seeds of different families are independent streams (the generator
is seeded with ``(family index, seed)``), and the seed ranges of training, evaluation and validation
(``tag.training.config``) are shared by all families. Sizes stay where a placement search is cheap:
2–32 devices.

| family | what |
| --- | --- |
| ``tag-random`` | TAG §5.2: 1–6 machines of 1–8 V100/1080Ti/P100, 64–160 / 20–50 Gbps |
| ``nvlink`` | DGX-like machines: 8 V100 in DGX-1's hybrid cube-mesh, 4 in an NVLink quad, or NVLink pairs over PCIe |
| ``mixed-gen`` | machines of different GPU generations (P100 to H100), NVLink where the GPU has it, PCIe otherwise |
| ``mesh`` | 2D and 3D meshes, bandwidth by hop count (Parmesan Table IX) |
| ``torus`` | 2D and 3D tori |
| ``random-blk-1`` / ``random-blk-2`` / ``uniform-dist`` | Parmesan's look-up tables |

``HELD_OUT`` families are never drawn by training: the evaluation judges transfer on them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tag.cluster.build import INTRA_LATENCY_S, NETWORK_LATENCY_S, Link, Machine, build_cluster
from tag.cluster.cluster import Cluster
from tag.cluster.generators import grid_cluster, random_blk_1, random_blk_2, tag_random, uniform_dist
from tag.errors import ClusterError

__all__ = ["FAMILIES", "HELD_OUT", "TRAIN_FAMILIES", "family_cluster"]

_GB = 1e9
_GBPS = 1e9 / 8

# DGX-1's hybrid cube-mesh (the dgx1x4 preset's link lists, repeated here to keep this module below presets).
_DGX1_SINGLE = ((0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7))
_DGX1_DOUBLE = ((0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7))
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


def _nvlink_machine(m: int, base: int, rng: np.random.Generator) -> tuple[Machine, list[Link]]:
    """One DGX-like machine whose first global device is ``base``: a DGX-1 (8 V100, cube-mesh of single and
    double NVLinks), an NVLink quad (4 V100, every pair linked) or NVLink pairs (2 or 4 pairs over PCIe)."""
    pcie = float(rng.uniform(*_PCIE))
    kind = int(rng.integers(3))
    if kind == 0:
        links = [Link(base + a, base + b, _NVLINK_LANE) for a, b in _DGX1_SINGLE]
        links += [Link(base + a, base + b, 2 * _NVLINK_LANE) for a, b in _DGX1_DOUBLE]
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


def family_cluster(family: str, seed: int) -> Cluster:
    """The cluster of ``family`` drawn from ``seed`` (deterministic; families are independent streams)."""
    if family not in FAMILIES:
        raise ClusterError(f"unknown topology family {family!r} (known: {', '.join(FAMILIES)})")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ClusterError(f"a topology seed must be a non-negative integer, got {seed!r}")
    if family == "tag-random":  # TAG's own seeds: the clusters the shipped policy and its evaluations used
        return tag_random(seed=int(seed))
    rng = np.random.default_rng([list(FAMILIES).index(family), int(seed)])
    return FAMILIES[family](rng, f"{family}-s{seed}")
