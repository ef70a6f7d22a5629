"""The self-play training loop (TAG §4.2.2, §5.2), in rounds.

A round: play ``games_per_round`` games with the current weights (:mod:`tag.training.selfplay`), add
their states to the replay buffer, take ``updates_per_round`` Adam steps on minibatches drawn from it
(cross-entropy between the policy and the visit-count targets, gradients clipped), log, and every
``checkpoint_every`` rounds write the training checkpoint and the policy. A run stops at the first round
boundary at which ``total_steps`` gradient steps are done, so an interrupted run resumed from its last
checkpoint takes exactly the steps the uninterrupted run would have taken.

Files under the output folder: ``checkpoint.pt`` (training state, :mod:`tag.training.state`),
``policy.pt`` (:func:`tag.policy.save_policy`: what ``tag plan --policy`` reads), ``history.json`` (one
row of scalars per round, for plots) and ``tensorboard/`` (SummaryWriter events).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from torch_geometric.data import HeteroData

from tag._atomic import atomic_write_text
from tag.policy import PolicyError, build_policy, load_policy, policy_loss, save_policy
from tag.training.config import TrainConfig
from tag.training.errors import TrainingError
from tag.training.selfplay import GameRecord, Outcome, Sample, SelfPlayPool, validation_instances
from tag.training.state import TrainState, load_train_state, save_train_state

__all__ = ["train", "TrainSummary", "train_step", "CHECKPOINT_NAME", "POLICY_NAME", "HISTORY_NAME"]

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
POLICY_NAME = "policy.pt"
HISTORY_NAME = "history.json"
_UPDATE_STREAM = 2  # rng stream tag of minibatch draws: (seed, _UPDATE_STREAM, step)
RoundCallback = Callable[[dict[str, Any]], None]


class TrainSummary(NamedTuple):
    """What :func:`train` returns (and ``tag train --json`` prints)."""

    step: int
    rounds: int
    games: int
    replay_size: int
    final_loss: float | None  # mean loss of the last round that took steps
    wall_s: float  # over every piece of the run, resumes included
    checkpoint: str
    policy: str
    history: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        out = self._asdict()
        out["last"] = self.history[-1] if self.history else None
        del out["history"]
        return out


def train(config: TrainConfig, out_dir: str | Path, *, resume: bool = False,
          on_round: RoundCallback | None = None) -> TrainSummary:
    """Run (or, with ``resume``, continue) training until ``config.total_steps`` (module docstring)."""
    torch.set_num_threads(1)
    out = Path(out_dir)
    state = _start(config, out, resume)
    config = state.config
    model = state.model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    if state.optimizer:
        optimizer.load_state_dict(state.optimizer)
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out / "tensorboard"), purge_step=state.step if state.step else None)
    begun, wall_before = time.perf_counter(), state.history[-1]["wall_s"] if state.history else 0.0
    try:
        with SelfPlayPool(config.workers) as pool:
            if not state.history and config.validation_instances:  # the references: pure MCTS, untrained GNN
                row = {"round": 0, "step": 0, "games": 0, "wall_s": 0.0,
                       **_validation_row(pool, config, model, state, uniform=True),
                       **_validation_row(pool, config, model, state)}
                state = state._replace(history=[row])
                _log_row(writer, row, 0)
            while state.step < config.total_steps:
                state = _round(pool, config, model, optimizer, state)
                row = state.history[-1]
                row["wall_s"] = wall_before + time.perf_counter() - begun
                if state.round % config.validate_every == 0 or state.step >= config.total_steps:
                    row.update(_validation_row(pool, config, model, state))
                if state.round % config.log_every == 0:
                    _log_row(writer, row, state.step)
                if state.round % config.checkpoint_every == 0 or state.step >= config.total_steps:
                    _checkpoint(out, state._replace(optimizer=optimizer.state_dict()), optimizer)
                if on_round is not None:
                    on_round(row)
    finally:
        writer.close()
    final = next((r["loss"] for r in reversed(state.history) if r.get("loss") is not None), None)
    wall = state.history[-1]["wall_s"] if state.history else 0.0
    return TrainSummary(state.step, state.round, state.games, len(state.replay), final, wall,
                        str(out / CHECKPOINT_NAME), str(out / POLICY_NAME), state.history)


def _start(config: TrainConfig, out: Path, resume: bool) -> TrainState:
    checkpoint = out / CHECKPOINT_NAME
    for name in (CHECKPOINT_NAME, POLICY_NAME, HISTORY_NAME):  # writes a kill cut short (tag._atomic's names)
        for stale in out.glob(f".{name}.*.tmp"):
            stale.unlink(missing_ok=True)
    if resume:
        if not checkpoint.is_file():
            raise TrainingError(f"--resume: no training checkpoint at {str(checkpoint)!r}")
        state = load_train_state(checkpoint, config)
        log.info("resumed %s at step %d (round %d, %d games)", checkpoint, state.step, state.round, state.games)
        return state
    if checkpoint.exists():
        raise TrainingError(f"{str(checkpoint)!r} exists: pass --resume to continue that run, or another --out")
    model = build_policy(config.policy, seed=config.seed) if config.init_policy is None else _initial(config)
    return TrainState(model, {}, config, 0, 0, 0, [], [])


def _initial(config: TrainConfig) -> torch.nn.Module:
    """The weights of ``config.init_policy`` (fine-tuning); its architecture must be the config's."""
    try:
        loaded = load_policy(config.init_policy)
    except PolicyError as exc:
        raise TrainingError(f"init_policy: {exc}") from None
    if loaded.config != config.policy:
        raise TrainingError(f"init_policy {config.init_policy!r} has the architecture {loaded.config.to_dict()}, "
                            f"the config's [policy] is {config.policy.to_dict()}")
    return loaded.model


def _round(pool: SelfPlayPool, config: TrainConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
           state: TrainState) -> TrainState:
    """Play one round's games, then train on the replay buffer; returns the state after it."""
    started = time.perf_counter()
    games = range(state.games, state.games + config.games_per_round)
    records = list(pool.play(config, model.eval(), games, version=state.step))
    play_s = time.perf_counter() - started
    replay = (state.replay + [s for r in records for s in r.samples])[-config.replay_capacity:]
    losses, step = [], state.step
    if len(replay) >= config.min_replay:
        model.train()
        for _ in range(config.updates_per_round):
            losses.append(train_step(model, optimizer, replay, config, step))
            step += 1
    row = _round_row(records, losses, play_s, time.perf_counter() - started, step, state, len(replay))
    return state._replace(step=step, round=state.round + 1, games=games.stop, replay=replay,
                          history=state.history + [row])


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, replay: list[Sample],
               config: TrainConfig, step: int) -> float:
    """One Adam step on a minibatch drawn by ``(seed, step)``: returns its loss (TAG §4.2.2's cross-entropy)."""
    rng = np.random.default_rng([config.seed, _UPDATE_STREAM, step])
    picks = rng.choice(len(replay), size=min(config.batch_size, len(replay)), replace=False)
    batch = [replay[int(k)] for k in picks]
    loss = policy_loss(model, [HeteroData.from_dict(s.data) for s in batch], [s.target for s in batch])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return float(loss.detach())


def _round_row(records: list[GameRecord], losses: list[float], play_s: float, round_s: float, step: int,
               before: TrainState, replay_size: int) -> dict[str, Any]:
    beats = [r.first_beat_iteration for r in records if r.first_beat_iteration is not None]
    samples = sum(len(r.samples) for r in records)
    return {
        "round": before.round + 1, "step": step, "games": before.games + len(records),
        "loss": float(np.mean(losses)) if losses else None,
        "selfplay_speedup": float(np.mean([r.best_speedup for r in records])),
        "selfplay_iterations_to_beat": float(np.mean(beats)) if beats else None,
        "samples": samples, "replay": replay_size,
        "games_per_s": len(records) / play_s if play_s > 0 else None,
        "samples_per_s": samples / play_s if play_s > 0 else None,
        "simulations_per_s": sum(r.simulations for r in records) / play_s if play_s > 0 else None,
        "round_s": round_s, "wall_s": 0.0,
    }


def _validation_row(pool: SelfPlayPool, config: TrainConfig, model: torch.nn.Module, state: TrainState, *,
                    uniform: bool = False) -> dict[str, Any]:
    """Mean iterations to beat DP-NCCL (a miss counts as budget + 1) and mean speed-up on the validation set."""
    budget = config.validation_iterations
    outcomes: list[Outcome] = list(pool.search(config, None if uniform else model.eval(),
                                               validation_instances(config), version=state.step,
                                               iterations=budget, seed=0))
    prefix = "val_uniform" if uniform else "val"
    iterations = [o.first_beat_iteration if o.first_beat_iteration is not None else budget + 1 for o in outcomes]
    row = {f"{prefix}_iterations_to_beat": float(np.mean(iterations)),
           f"{prefix}_beat_fraction": float(np.mean([o.first_beat_iteration is not None for o in outcomes])),
           f"{prefix}_speedup": float(np.mean([o.best_speedup for o in outcomes]))}
    log.info("validation (%s) at step %d: %s", "uniform priors" if uniform else "policy", state.step, row)
    return row


def _log_row(writer: Any, row: dict[str, Any], step: int) -> None:
    names = {"loss": "train/loss", "selfplay_speedup": "selfplay/mean_speedup",
             "selfplay_iterations_to_beat": "selfplay/iterations_to_beat", "games_per_s": "throughput/games_per_s",
             "samples_per_s": "throughput/samples_per_s", "simulations_per_s": "throughput/simulations_per_s",
             "replay": "train/replay_size"}
    for key, value in row.items():
        tag = names.get(key) or (key.replace("_", "/", 1) if key.startswith("val") else None)
        if tag and isinstance(value, (int, float)) and math.isfinite(value):
            writer.add_scalar(tag, value, step)
    writer.flush()


def _checkpoint(out: Path, state: TrainState, optimizer: torch.optim.Optimizer) -> None:
    save_train_state(out / CHECKPOINT_NAME, state)
    save_policy(out / POLICY_NAME, state.model, state.config.policy, optimizer, state.step)
    atomic_write_text(out / HISTORY_NAME, json.dumps(state.history, indent=1) + "\n")
    log.info("checkpoint at step %d (round %d) in %s", state.step, state.round, out)
