"""Training the learned stage-to-device mapper (:mod:`tag.policy.mapping`) by imitating the exact mapper.

**Data.** A training instance is a Parmesan-style mapping problem: a topology drawn from one of
``config.families`` (:data:`FAMILIES`: Parmesan §VI-D's 2D mesh, 2D torus, random_blk_1, random_blk_2 and
uniform_dist, TAG's random hierarchical clusters of machines with mixed GPUs, and
:mod:`tag.cluster.families`' NVLink islands and mixed GPU generations drawn at the instance's device
count; :data:`HELD_OUT` is left out by default, for the comparison to judge transfer on) and a stage
graph from a zoo model cut into S stages by the PipeDream-style linear DP (:func:`zoo_stage_graph`),
R = ⌊D/S⌋ replicas. Its target
is the exact mapper's mapping (binary search + DFS, Parmesan Algorithms 1–2) within a time limit:
optimal when proven, the best found otherwise. Random families draw seeds from ``seed`` up, so a run
with seeds ≥ 1000 never sees the seed-0 topologies of ``scripts/compare_mappers.py``; the models of
:data:`TRAIN_MODELS` leave out the BERT family the comparison runs on.

**Why imitation and not self-play.** The mapping tree has an exact teacher that is cheap up to ~64
devices (a median 0.08 s at 64 in docs/compare_mappers.md); its optimum is a far sharper target than
MCTS visit counts, and the learned mapper exists for the sizes where the teacher gives up (128–256
devices), where it must generalise. Each step of the optimal mapping is a classification over the free
devices, trained with cross-entropy under teacher forcing (:func:`tag.policy.mapping.imitation_loss`),
Adam and gradient clipping.

**Files** under ``out``: ``data.pt`` (the instances and targets, reused by a resumed run),
``checkpoint.pt`` (the policy with its optimizer, written atomically after every epoch; ``resume=True``
continues from it), ``best.pt`` (the policy of the epoch with the least mean validation gap so far: the
greedy decode's gap is noisy from epoch to epoch and later epochs can overfit), ``history.json`` (loss and
validation gap per epoch).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from tag._atomic import atomic_open, atomic_write_text
from tag._rng import as_rng
from tag.cluster import resolve_cluster
from tag.cluster.cluster import Cluster
from tag.cluster.families import family_cluster
from tag.exact import ForwardGraph, build_stage_graph, partition_pipedream
from tag.exact.mapping import MappingProblem, choose_instantiation, solve_mapping
from tag.exact.stage_graph import StageGraph
from tag.graph.resolve import resolve_model
from tag.policy.checkpoint import load_torch_file
from tag.policy.mapping import (
    MappingDecoder,
    MappingInstance,
    MappingPolicy,
    MappingPolicyConfig,
    imitation_loss,
    load_mapping_policy,
    save_mapping_policy,
)
from tag.training.errors import TrainingError

__all__ = ["MapperTrainConfig", "MappingExample", "zoo_stage_graph", "sample_problem", "build_examples",
           "train_mapper", "stage_gpus", "trained_families", "TRAIN_MODELS", "FAMILIES", "HELD_OUT", "TRAIN_FAMILIES",
           "UNNAMED_FAMILIES", "GPU_TYPES"]

TRAIN_MODELS = ("resnet101", "resnet152", "vgg19", "inception-v3", "transformer", "bert-small", "gpt2")
FAMILIES = ("2d mesh", "2d torus", "random_blk_1", "random_blk_2", "uniform_dist", "hierarchical", "nvlink",
            "mixed-gen")
HELD_OUT = ("random_blk_2",)  # not trained on by default: scripts/compare_mappers.py judges transfer on it
TRAIN_FAMILIES = tuple(f for f in FAMILIES if f not in HELD_OUT)
# what a checkpoint was trained on when its train_config names no families (the Parmesan and TAG families)
UNNAMED_FAMILIES = FAMILIES[:6]
_SIZED_FAMILIES = ("nvlink", "mixed-gen")  # drawn by tag.cluster.families at the instance's device count
GPU_TYPES = ("v100-32gb", "1080ti", "p100")  # what TAG's random clusters draw from
PARTITION_BANDWIDTH = 10e9  # bytes/s the partitioner prices boundary tensors at (the mapper sees the real links)
_GRIDS = {8: ("2x4",), 16: ("4x4", "2x8"), 32: ("4x8",), 64: ("8x8", "4x16")}
DATA_NAME, CHECKPOINT_NAME, BEST_NAME, HISTORY_NAME = "data.pt", "checkpoint.pt", "best.pt", "history.json"


@dataclass(frozen=True)
class MapperTrainConfig:
    """One training run of the mapping policy (what ``scripts/train_mapper.py`` gathers)."""

    instances: int = 1000  # training instances (one exact solve each)
    validation: int = 60  # further instances, for the greedy gap per epoch
    devices: tuple[int, ...] = (8, 16, 32, 64)  # device counts of the grid and random-block families
    seed: int = 1000  # first topology seed; compare_mappers uses seeds from 0
    families: tuple[str, ...] = TRAIN_FAMILIES  # topology families drawn (FAMILIES)
    exact_time_limit: float = 2.0  # seconds per target
    epochs: int = 40
    batch: int = 8  # instances per Adam step
    lr: float = 2e-3
    clip: float = 1.0  # gradient norm clip
    policy: MappingPolicyConfig = MappingPolicyConfig()

    def __post_init__(self) -> None:
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise TrainingError(f"families must be some of {', '.join(FAMILIES)}, got {list(self.families)!r}")
        object.__setattr__(self, "families", tuple(self.families))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class MappingExample(NamedTuple):
    """A problem, its objective, and the exact mapper's mapping in the search's slot order."""

    problem: MappingProblem
    instantiation: str
    lower_bound: float
    devices: np.ndarray  # [K] device of slot k (MappingEnv's order)
    optimum: float  # max stage time of the target, seconds
    proven: bool
    description: str


# --------------------------------------------------------------------------------------- instances


@functools.lru_cache(maxsize=None)
def _forward_view(model: str, gpus: tuple[str, ...]) -> ForwardGraph:
    return ForwardGraph.from_graph(resolve_model(model), list(gpus))


@functools.lru_cache(maxsize=256)
def zoo_stage_graph(model: str, stages: int, replicas: int, gpus: tuple[str, ...] = ("v100-32gb",)) -> StageGraph:
    """``model`` cut into ``stages`` contiguous stages by the PipeDream-style DP at ``replicas`` replicas,
    M = min(S, batch / R) micro-batches, boundary tensors priced at :data:`PARTITION_BANDWIDTH`; stage
    times on each of ``gpus``."""
    view = _forward_view(model, gpus)
    micro_batches = max(1, min(stages, view.batch_size // replicas))
    part = partition_pipedream(view, stages=stages, replicas=replicas, micro_batches=micro_batches,
                               bandwidth=PARTITION_BANDWIDTH)
    return build_stage_graph(view, part.forward_stage, replicas=replicas, micro_batches=micro_batches)


def _family_cluster(family: str, devices: int, rng: np.random.Generator, seed: int) -> Cluster:
    if family in ("2d mesh", "2d torus"):
        grid = _GRIDS[devices][int(rng.integers(len(_GRIDS[devices])))]
        return resolve_cluster(f"{'mesh2d' if family == '2d mesh' else 'torus2d'}:{grid}")
    if family == "hierarchical":
        return resolve_cluster(f"tag-random:seed={seed}")
    if family in _SIZED_FAMILIES:
        return family_cluster(family, seed, devices=devices)
    name = {"random_blk_1": "random-blk-1", "random_blk_2": "random-blk-2", "uniform_dist": "uniform-dist"}[family]
    return resolve_cluster(f"{name}:{devices},seed={seed}")


def trained_families(meta: dict[str, Any]) -> tuple[str, ...]:
    """The families a checkpoint's policy was trained on, from its ``meta`` (:func:`train_mapper`'s)."""
    return tuple((meta.get("train_config") or {}).get("families") or UNNAMED_FAMILIES)


def stage_gpus(cluster: Cluster) -> tuple[str, ...]:
    """The GPU types a zoo stage graph for ``cluster`` is timed on: every type of the cluster
    (MappingProblem.from_stage_graph gives each device its own type's time only then)."""
    names = {t.name for t in cluster.types}
    if len(names) == 1:
        return ("v100-32gb",)
    return GPU_TYPES if names <= set(GPU_TYPES) else tuple(sorted(names))


def sample_problem(rng: np.random.Generator, seed: int, devices: tuple[int, ...] = (8, 16, 32, 64),
                   models: tuple[str, ...] = TRAIN_MODELS,
                   families: tuple[str, ...] = TRAIN_FAMILIES) -> tuple[MappingProblem, str]:
    """A random training problem (module docstring) and a description of it; ``seed`` seeds the topology."""
    family = families[int(rng.integers(len(families)))]
    count = int(devices[int(rng.integers(len(devices)))])
    cluster = _family_cluster(family, count, rng, seed)
    count = cluster.num_devices
    model = models[int(rng.integers(len(models)))]
    depths = [s for s in (2, 4, 8, 16) if s <= count and s < 2 * count]
    stages = depths[int(rng.integers(len(depths)))] if count >= 2 else 1
    replicas = max(1, count // stages)
    graph = zoo_stage_graph(model, stages, replicas, stage_gpus(cluster))
    problem = MappingProblem.from_stage_graph(graph, replicas, cluster)
    return problem, f"{model} S={stages} R={replicas} on {cluster.name} ({family}, {count} devices)"


def build_examples(count: int, seed: int, *, devices: tuple[int, ...] = (8, 16, 32, 64),
                   time_limit: float = 2.0, families: tuple[str, ...] = TRAIN_FAMILIES,
                   progress: Callable[[int, str], None] | None = None) -> list[MappingExample]:
    """``count`` problems with topology seeds ``seed``, ``seed + 1``, …, each solved by the exact mapper."""
    from tag.search import MappingEnv  # tag.search imports tag.exact; keep the import local like the mappers

    rng = as_rng(seed)
    out = []
    for k in range(count):
        problem, description = sample_problem(rng, seed + k, devices, families=families)
        mode = choose_instantiation(problem)
        result = solve_mapping(problem, instantiation=mode, time_limit=time_limit, seed=seed + k)
        env = MappingEnv(problem, instantiation=mode, lower_bound=result.lower_bound)
        slots = np.asarray(result.mapping)[env.slot_stage, env.slot_replica]
        out.append(MappingExample(problem, mode, float(result.lower_bound), slots, float(result.max_stage_time),
                                  bool(result.proven_optimal), description))
        if progress is not None:
            progress(k + 1, description)
    return out


def greedy_gap(policy: MappingPolicy, example: MappingExample) -> float:
    """(t − optimum) / t of the policy's greedy decode, t its max stage time: 0 when it finds an optimum."""
    from tag.search import MappingEnv

    env = MappingEnv(example.problem, instantiation=example.instantiation, lower_bound=example.lower_bound)
    decoder = MappingDecoder(policy, MappingInstance.from_env(env))
    env.fill = decoder.complete
    value = env.evaluate(()).time
    return max(0.0, (value - example.optimum) / value) if value > 0 else 0.0


# --------------------------------------------------------------------------------------- (de)serialising


def _example_to_dict(example: MappingExample) -> dict[str, Any]:
    p = example.problem
    arrays = {"stage_time": p.stage_time, "edge_src": p.edge_src, "edge_dst": p.edge_dst, "edge_bytes": p.edge_bytes,
              "param_bytes": p.param_bytes, "bandwidth": np.where(np.isinf(p.bandwidth), 0.0, p.bandwidth),
              "latency": p.latency, "device_type": p.device_type, "devices": example.devices}
    out: dict[str, Any] = {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}
    out.update(replicas=p.num_replicas, instantiation=example.instantiation, lower_bound=example.lower_bound,
               optimum=example.optimum, proven=example.proven, description=example.description)
    return out


def _example_from_dict(row: dict[str, Any]) -> MappingExample:
    problem = MappingProblem(row["stage_time"].numpy(), row["edge_src"].numpy(), row["edge_dst"].numpy(),
                             row["edge_bytes"].numpy(), row["param_bytes"].numpy(), int(row["replicas"]),
                             row["bandwidth"].numpy(), row["latency"].numpy(), row["device_type"].numpy())
    return MappingExample(problem, row["instantiation"], float(row["lower_bound"]), row["devices"].numpy(),
                          float(row["optimum"]), bool(row["proven"]), row["description"])


def _load_examples(path: Path, config: MapperTrainConfig) -> tuple[list[MappingExample], list[MappingExample]] | None:
    if not path.is_file():
        return None
    payload = load_torch_file(path, what="training data file", error=TrainingError)
    if not isinstance(payload, dict) or payload.get("config") != _data_key(config):
        raise TrainingError(f"{str(path)!r} holds data of another configuration; remove it or use another --out")
    return ([_example_from_dict(r) for r in payload["train"]], [_example_from_dict(r) for r in payload["validation"]])


def _data_key(config: MapperTrainConfig) -> dict[str, Any]:
    return {"instances": config.instances, "validation": config.validation, "devices": list(config.devices),
            "seed": config.seed, "exact_time_limit": config.exact_time_limit, "families": list(config.families)}


# --------------------------------------------------------------------------------------- training


def train_mapper(config: MapperTrainConfig, out: str | Path, *, resume: bool = False,
                 progress: Callable[[str, int, int, str], None] | None = None) -> dict[str, Any]:
    """Build (or reuse) the data, train ``config.epochs`` epochs, checkpoint after each; return the history.

    ``progress(phase, done, total, text)`` reports data building ("data") and training ("train").
    ``resume``: continue from ``out/checkpoint.pt`` (its step counts epochs); without it an existing
    checkpoint is an error, so that a run never silently overwrites another.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint_path = out / CHECKPOINT_NAME
    if checkpoint_path.exists() and not resume:
        raise TrainingError(f"{str(checkpoint_path)!r} exists: pass resume=True (--resume) or another output folder")
    report = progress or (lambda phase, done, total, text: None)
    data_path = out / DATA_NAME
    started = time.perf_counter()
    loaded = _load_examples(data_path, config)
    if loaded is None:
        total = config.instances + config.validation
        examples = build_examples(total, config.seed, devices=config.devices, time_limit=config.exact_time_limit,
                                  families=config.families,
                                  progress=lambda done, text: report("data", done, total, text))
        train, validation = examples[:config.instances], examples[config.instances:]
        with atomic_open(data_path) as handle:
            torch.save({"config": _data_key(config), "train": [_example_to_dict(e) for e in train],
                        "validation": [_example_to_dict(e) for e in validation]}, handle)
    else:
        train, validation = loaded
    data_seconds = time.perf_counter() - started

    torch.manual_seed(config.seed)
    policy = MappingPolicy(config.policy)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    history: list[dict[str, Any]] = []
    epoch = 0
    if resume and checkpoint_path.exists():
        saved = load_mapping_policy(checkpoint_path)
        if saved.config != config.policy:
            raise TrainingError(f"{str(checkpoint_path)!r} holds a policy of config {saved.config}, not {config.policy}")
        policy = saved.model
        optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
        if saved.optimizer is not None:
            optimizer.load_state_dict(saved.optimizer)
        epoch = saved.step
        history = list(saved.meta.get("history", []))
    instances = [MappingInstance.build(e.problem, e.instantiation, *_slot_order(e)) for e in train]
    steps_per_epoch = math.ceil(len(train) / config.batch)
    while epoch < config.epochs:
        policy.train()
        order = as_rng(config.seed + epoch).permutation(len(train))
        losses = []
        tick = time.perf_counter()
        for step in range(steps_per_epoch):
            chosen = order[step * config.batch:(step + 1) * config.batch]
            optimizer.zero_grad()
            loss = sum(imitation_loss(policy(instances[i]), instances[i], train[i].devices) for i in chosen) / len(chosen)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), config.clip)
            optimizer.step()
            losses.append(loss.item())
            report("train", epoch * steps_per_epoch + step + 1, config.epochs * steps_per_epoch,
                   f"epoch {epoch + 1}, loss {np.mean(losses):.3f}")
        policy.eval()
        gaps = [greedy_gap(policy, e) for e in validation]
        epoch += 1
        history.append({"epoch": epoch, "loss": float(np.mean(losses)), "validation_median_gap": float(np.median(gaps)),
                        "validation_mean_gap": float(np.mean(gaps)), "epoch_seconds": time.perf_counter() - tick})
        meta = {"history": history, "train_config": _jsonable(config.to_dict()), "data_seconds": data_seconds,
                "proven_targets": int(sum(e.proven for e in train)), "instances": len(train)}
        save_mapping_policy(checkpoint_path, policy, optimizer, epoch, meta)
        if history[-1]["validation_mean_gap"] <= min(row["validation_mean_gap"] for row in history):
            save_mapping_policy(out / BEST_NAME, policy, None, epoch, meta)
        atomic_write_text(out / HISTORY_NAME, json.dumps(history, indent=1) + "\n")
    return {"history": history, "data_seconds": data_seconds, "checkpoint": str(checkpoint_path),
            "best": str(out / BEST_NAME),
            "proven_targets": int(sum(e.proven for e in train)), "instances": len(train)}


def _slot_order(example: MappingExample) -> tuple[np.ndarray, np.ndarray]:
    from tag.search import MappingEnv

    env = MappingEnv(example.problem, instantiation=example.instantiation, lower_bound=example.lower_bound)
    return env.slot_stage, env.slot_replica


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))
