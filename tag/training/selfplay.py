"""Self-play (TAG §4.2.2, §5.2): one game = one MCTS over a random (model, topology) pair, guided by the
current policy; its output is the (features, visit-count target) pairs of the well-visited vertices.

Every random choice of game k derives from ``(config.seed, k)`` alone, never from the order in which
games finish or the process that plays them, so a run gives the same data with 0, 1 or 2 workers and
after a resume. Workers get the round's weights with each task and keep the loaded graphs between games.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from multiprocessing import get_context
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import torch

from tag.cluster import Cluster, tag_random
from tag.cluster.families import family_cluster
from tag.graph import OpGraph
from tag.grouping import GroupGraph, group_ops
from tag.policy import FeatureCache, GNNEvaluator, HeteroPolicy, state_to_data
from tag.search import (PlacementEnv, PlacementState, SearchResult, beats_reference, mcts_search,
                        uniform_batch_evaluator)
from tag.training.config import VALIDATION_SEED_START, TrainConfig

__all__ = ["Instance", "Sample", "GameRecord", "Outcome", "game_instance", "validation_instances", "play_game",
           "search_instance", "mix_uniform", "SelfPlayPool", "build_instance", "make_env", "NoisyRoot"]

_GAME_STREAM = 1  # rng stream tags: (seed, _GAME_STREAM, game) for games, see tag.training.loop for updates


class Instance(NamedTuple):
    """A (model, topology) pair to plan for."""

    model: str  # zoo name
    topology_seed: int  # seed of the family's generator (ignored when ``cluster`` is given)
    cluster: str | None = None  # a preset address or spec file instead of a random topology (evaluation)
    family: str = "tag-random"  # topology family (tag.cluster.families) the seed draws from


class Sample(NamedTuple):
    """One training state: the GNN input as a plain dict (HeteroData.to_dict, so it survives
    ``torch.load(weights_only=True)``) and π over its A candidates."""

    data: dict[Any, Any]
    target: torch.Tensor  # [A] float32, sums to 1


class GameRecord(NamedTuple):
    """What one self-play game returns."""

    game: int  # its index in the run
    instance: Instance
    samples: list[Sample]
    best_speedup: float  # over DP-NCCL (or the single-device reference when DP-NCCL does not fit)
    first_beat_iteration: int | None  # first iteration whose plan beat the reference
    iterations: int
    simulations: int
    seconds: float


def game_instance(config: TrainConfig, game: int) -> tuple[Instance, np.random.Generator]:
    """Game ``game``'s instance and the rng that seeds its search."""
    rng = np.random.default_rng([config.seed, _GAME_STREAM, game])
    model = config.models[int(rng.integers(len(config.models)))]
    topology = int(rng.integers(*config.topology_seeds))
    families = config.topology_families
    if families == ("tag-random",):  # TAG's generator alone: the draws of runs before families existed
        return Instance(model, topology), rng
    return Instance(model, topology, family=families[int(rng.integers(len(families)))]), rng


def validation_instances(config: TrainConfig) -> list[Instance]:
    """The run's validation set: models and families in turn, topology seeds from VALIDATION_SEED_START."""
    families = config.topology_families
    return [Instance(config.models[k % len(config.models)], VALIDATION_SEED_START + k,
                     family=families[k % len(families)])
            for k in range(config.validation_instances)]


@lru_cache(maxsize=16)
def _graph(model: str, tiny: bool) -> OpGraph:
    from tag.graph.resolve import resolve_model

    return resolve_model(model, tiny=tiny)


@lru_cache(maxsize=8)
def _preset(address: str) -> Cluster:
    from tag.cluster import resolve_cluster

    return resolve_cluster(address)


def _cluster(instance: Instance, machines: int | None) -> Cluster:
    # Random topologies are built afresh: a cache of clusters that are rarely drawn twice would only keep
    # memory alive.
    if instance.cluster is not None:
        return _preset(instance.cluster)
    if instance.family == "tag-random":
        return tag_random(seed=instance.topology_seed, machines=machines)
    return family_cluster(instance.family, instance.topology_seed)


def build_instance(instance: Instance, *, num_groups: int, tiny: bool = False, machines: int | None = None
                   ) -> tuple[GroupGraph, Cluster]:
    """The grouped model and the cluster of ``instance`` (graphs and clusters cached per process)."""
    cluster = _cluster(instance, machines)
    group_graph = group_ops(_graph(instance.model, tiny), num_groups=num_groups, gpus=cluster, seed=0)
    return group_graph, cluster


def make_env(config: TrainConfig, group_graph: GroupGraph, cluster: Cluster) -> PlacementEnv:
    return PlacementEnv(group_graph, cluster, order=config.order, fill=config.fill, graded_oom=True)


class NoisyRoot:
    """A batch evaluator that mixes Dirichlet noise into the priors of the root (no group decided):
    AlphaZero's exploration, so that self-play also visits actions the policy rates low."""

    def __init__(self, batch_evaluator: Any, *, epsilon: float, alpha: float, rng: np.random.Generator) -> None:
        self.batch_evaluator = batch_evaluator
        self.epsilon = epsilon
        self.alpha = alpha
        self.rng = rng

    def __call__(self, states: Sequence[PlacementState]) -> list[np.ndarray]:
        priors = self.batch_evaluator(states)
        for k, state in enumerate(states):
            if self.epsilon > 0 and len(priors[k]) > 1 and not state.decided.any():
                noise = self.rng.dirichlet(np.full(len(priors[k]), self.alpha))
                priors[k] = (1 - self.epsilon) * priors[k] + self.epsilon * noise
        return priors

    def one(self, state: PlacementState) -> np.ndarray:
        return self([state])[0]


def play_game(config: TrainConfig, model: HeteroPolicy | None, game: int) -> GameRecord:
    """Play game ``game`` with ``model``'s priors (None: uniform priors) and return its samples."""
    start = time.perf_counter()
    instance, rng = game_instance(config, game)
    group_graph, cluster = build_instance(instance, num_groups=config.num_groups, tiny=config.tiny,
                                          machines=config.machines)
    env = make_env(config, group_graph, cluster)
    base = GNNEvaluator(model).batch if model is not None else uniform_batch_evaluator
    noisy = NoisyRoot(base, epsilon=config.root_noise, alpha=config.noise_alpha,
                      rng=np.random.default_rng(rng.integers(2**63)))
    result = mcts_search(env, noisy.one, batch_evaluator=noisy, batch_size=config.leaf_batch,
                         c_puct=config.c_puct, max_iterations=config.mcts_iterations,
                         target_visits=config.min_visits, seed=int(rng.integers(2**63)))
    features = FeatureCache()  # the game's targets share one grouping and cluster: static features once
    samples = [Sample(_plain(state_to_data(t.state, features)), torch.from_numpy(t.policy.astype(np.float32)))
               for t in result.targets]
    return _record(game, instance, samples, result, time.perf_counter() - start)


class Outcome(NamedTuple):
    """How one search on an instance went (validation and evaluation)."""

    instance: Instance
    first_beat_iteration: int | None  # first iteration whose plan beat the reference; None: not within budget
    best_speedup: float  # at the end of the search (at the stop, with ``stop_on_beat``)
    iterations: int
    seconds: float
    reference: str  # "DP-NCCL", or the single-device reference when DP-NCCL does not fit


class _Beaten(Exception):
    """Raised by the progress callback to stop a search as soon as it beat the reference."""


def mix_uniform(batch_evaluator: Any, share: float) -> Any:
    """Priors (1 − share)·G + share·uniform: a floor under every candidate, so that a confident policy
    that is wrong about an unseen cluster still lets PUCT try the other actions."""
    if share <= 0:
        return batch_evaluator

    def mixed(states: Sequence[PlacementState]) -> list[np.ndarray]:
        return [(1 - share) * p + share / len(p) if len(p) else p for p in batch_evaluator(states)]

    return mixed


def search_instance(config: TrainConfig, model: HeteroPolicy | None, instance: Instance, *, iterations: int,
                    seed: int = 0, stop_on_beat: bool = False, uniform_mix: float = 0.0) -> Outcome:
    """MCTS on ``instance`` with ``model``'s priors (None: uniform, "pure MCTS"), no root noise.
    ``stop_on_beat``: stop at the first iteration whose plan beats the reference. ``uniform_mix``: see
    :func:`mix_uniform`."""
    start = time.perf_counter()
    group_graph, cluster = build_instance(instance, num_groups=config.num_groups, tiny=config.tiny,
                                          machines=config.machines)
    env = make_env(config, group_graph, cluster)
    batch = mix_uniform(GNNEvaluator(model).batch, uniform_mix) if model is not None else uniform_batch_evaluator
    seen: list[Any] = []

    def progress(report: Any) -> None:
        seen[:] = [report]
        if (stop_on_beat and env.reference_name == "DP-NCCL" and report.best_speedup > 0
                and beats_reference(env.reference_time / report.best_speedup, env.reference_time)):
            raise _Beaten

    try:
        result = mcts_search(env, lambda state: batch([state])[0], batch_evaluator=batch,
                             batch_size=config.leaf_batch, c_puct=config.c_puct, max_iterations=iterations,
                             target_visits=None, seed=seed, progress=progress)
        first, speedup, done = result.first_beat_iteration, float(result.best_speedup), result.num_iterations
    except _Beaten:
        report = seen[0]
        first, speedup, done = report.iteration, float(report.best_speedup), report.iteration
    return Outcome(instance, first, speedup, done, time.perf_counter() - start, env.reference_name)


def _record(game: int, instance: Instance, samples: list[Sample], result: SearchResult, seconds: float) -> GameRecord:
    return GameRecord(game, instance, samples, float(result.best_speedup), result.first_beat_iteration,
                      result.num_iterations, result.num_simulations, seconds)


def _plain(data: Any) -> dict[Any, Any]:
    """HeteroData → nested dict of tensors and ints, without PyG's empty global store."""
    return {key: dict(value) for key, value in data.to_dict().items() if key != "_global_store"}


# ----------------------------------------------------------------------------------------------- workers

_WORKER: dict[str, Any] = {}  # per worker process: the model of the last weights it was sent


def _init_worker(parent: int) -> None:
    torch.set_num_threads(1)
    _die_with(parent)


def _die_with(parent: int) -> None:
    """End this worker when the training process ``parent`` dies, even by SIGKILL (which runs no cleanup):
    Linux's parent-death signal; then check that the parent did not die before it was set."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def _worker_model(config: TrainConfig, version: int, weights: bytes | None) -> HeteroPolicy | None:
    if weights is None:
        return None
    if _WORKER.get("version") != version:
        model = HeteroPolicy(**config.policy.to_dict())
        model.load_state_dict(_unpack(weights))
        _WORKER.update(version=version, model=model.eval())
    return _WORKER["model"]


def _worker_game(config: TrainConfig, version: int, weights: bytes | None, game: int) -> GameRecord:
    record = play_game(config, _worker_model(config, version, weights), game)
    return record._replace(samples=_pack([{"data": s.data, "target": s.target} for s in record.samples]))


def _pack(value: Any) -> bytes:
    """Tensors cross process boundaries as bytes: torch's multiprocessing pickler would share each storage
    through a file descriptor, and a replay buffer of thousands of states would run out of them."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _unpack(blob: bytes) -> Any:
    return torch.load(io.BytesIO(blob), weights_only=True)


def _worker_search(config: TrainConfig, version: int, weights: bytes | None,
                   instance: Instance, options: dict[str, Any]) -> Outcome:
    return search_instance(config, _worker_model(config, version, weights), instance, **options)


class SelfPlayPool:
    """Plays the games of a round, in ``workers`` processes (0: in this process). Results come back in
    game order whatever the order they finish in."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = (ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                                          initargs=(os.getpid(),))
                      if workers > 0 else None)

    def play(self, config: TrainConfig, model: HeteroPolicy | None, games: Sequence[int], version: int
             ) -> Iterator[GameRecord]:
        if self._pool is None:
            for game in games:
                yield play_game(config, model, game)
            return
        weights = None if model is None else _pack(model.state_dict())
        futures = [self._pool.submit(_worker_game, config, version, weights, game) for game in games]
        for future in futures:
            record = future.result()
            yield record._replace(samples=[Sample(row["data"], row["target"]) for row in _unpack(record.samples)])

    def search(self, config: TrainConfig, model: HeteroPolicy | None, instances: Sequence[Instance],
               version: int, **options: Any) -> Iterator[Outcome]:
        """:func:`search_instance` on every instance, in order (``options``: its keyword arguments)."""
        if self._pool is None:
            for instance in instances:
                yield search_instance(config, model, instance, **options)
            return
        weights = None if model is None else _pack(model.state_dict())
        futures = [self._pool.submit(_worker_search, config, version, weights, instance, options)
                   for instance in instances]
        for future in futures:
            yield future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SelfPlayPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
