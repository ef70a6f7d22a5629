"""The self-play training configuration (TAG §4.2.2, §5.2): a frozen dataclass read from a TOML file.

A config file holds top-level fields of :class:`TrainConfig` and an optional ``[policy]`` table with the
fields of :class:`tag.policy.PolicyConfig`. Unknown fields, wrong types and bad values raise
:class:`TrainingError` naming the field.

**Seeds.** Training topologies are ``tag_random(seed=s)`` for s in ``topology_seeds`` (a half-open
range). Seeds at or above :data:`EVAL_SEED_START` are reserved: evaluation (scripts/eval_generalization.py)
draws from ``[EVAL_SEED_START, VALIDATION_SEED_START)``, the validation set of the training run from
``VALIDATION_SEED_START`` on, so no topology the policy trained on is ever used to judge it.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tag._read import read_input
from tag._rng import MAX_SEED
from tag.cluster.families import FAMILIES, HELD_OUT
from tag.policy import PolicyConfig, PolicyError
from tag.training.errors import TrainingError

__all__ = ["TrainConfig", "load_config", "EVAL_SEED_START", "VALIDATION_SEED_START", "RUNTIME_FIELDS"]

EVAL_SEED_START = 1_000_000  # topology seeds reserved for evaluation start here
VALIDATION_SEED_START = 2_000_000  # ... and those of the training run's validation set here
# Fields that only say how long or how a run executes; a resumed run may change them.
RUNTIME_FIELDS = frozenset({"total_steps", "workers", "checkpoint_every", "validate_every", "log_every"})


@dataclass(frozen=True)
class TrainConfig:
    """Everything a self-play training run depends on; see training/configs/*.toml."""

    # what to play
    models: tuple[str, ...] = ("inception-v3", "resnet101", "vgg19", "transformer", "bert-small", "bert-large")
    tiny: bool = False  # use the tiny variants of the zoo graphs (datasets/*-tiny.json.gz): for tests
    num_groups: int = 12  # METIS op groups per model: one tree level each
    topology_seeds: tuple[int, int] = (0, EVAL_SEED_START)  # [start, stop) of tag_random seeds for training
    machines: int | None = None  # fix the machine count of random topologies (None: TAG's 1-6)
    # topology families games draw from, in turn by the game's rng (tag.cluster.families; not the held-out)
    topology_families: tuple[str, ...] = ("tag-random",)
    # the search of one self-play game
    mcts_iterations: int = 150  # leaves evaluated per game (TAG used thousands; CPU time is short here)
    min_visits: int = 12  # record π at vertices with at least this many visits (TAG: 800)
    leaf_batch: int = 8  # leaves whose priors one GNN forward computes (virtual loss between them)
    c_puct: float = 3.0  # exploration constant c of TAG §4.2.2
    order: str = "impact"  # tree level order of tag.search.PlacementEnv ("compute": TAG's)
    fill: str = "first"  # default fill of undecided groups (TAG footnote 2)
    root_noise: float = 0.25  # AlphaZero's ε: share of Dirichlet noise mixed into the root priors
    noise_alpha: float = 0.3  # AlphaZero's Dirichlet α of that noise
    # rounds: play games_per_round games with the current weights, then take updates_per_round steps
    games_per_round: int = 4  # self-play games per round
    updates_per_round: int = 8  # gradient steps per round
    batch_size: int = 32  # states per gradient step
    replay_capacity: int = 4000  # newest states kept for training (FIFO)
    min_replay: int = 16  # no gradient step until the buffer holds this many states
    # optimisation
    learning_rate: float = 1e-3  # Adam
    weight_decay: float = 1e-5  # Adam's L2 term
    grad_clip: float = 1.0  # max global gradient norm
    # validation: GNN-guided MCTS on fixed topologies from VALIDATION_SEED_START
    validation_instances: int = 6  # (model, topology) pairs; models taken in turn
    validation_iterations: int = 100  # MCTS budget of each; a miss counts as budget + 1
    # run
    total_steps: int = 400  # gradient steps of the whole run (``--steps`` overrides)
    workers: int = 1  # self-play processes (0: play in the training process)
    checkpoint_every: int = 1  # rounds between training checkpoints
    validate_every: int = 10  # rounds between validations (and one at step 0)
    log_every: int = 1  # rounds between TensorBoard scalars
    seed: int = 0  # every random choice of the run derives from it
    init_policy: str | None = None  # start from this policy checkpoint's weights (fine-tuning), not at random
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # the GNN's hyper-parameters

    def __post_init__(self) -> None:
        _validate(self)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["models"] = list(self.models)
        out["topology_seeds"] = list(self.topology_seeds)
        out["topology_families"] = list(self.topology_families)
        return out

    @classmethod
    def from_dict(cls, values: Any, *, where: str = "config") -> TrainConfig:
        """The config of a plain dict (a TOML document or a checkpoint's); TrainingError naming the field."""
        if not isinstance(values, dict):
            raise TrainingError(f"{where}: expected a table of fields, got {type(values).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise TrainingError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
        values = dict(values)
        if "policy" in values:
            try:
                values["policy"] = PolicyConfig.from_dict(values["policy"])
            except (PolicyError, TypeError) as exc:
                raise TrainingError(f"{where}: [policy]: {exc}") from None
        for key in ("models", "topology_seeds", "topology_families"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        try:
            return cls(**values)
        except TrainingError as exc:
            raise TrainingError(f"{where}: {exc}") from None

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


def load_config(path: str | os.PathLike) -> TrainConfig:
    """Read a TOML config file (stdlib tomllib)."""
    path = Path(path)
    raw = read_input(path, what="training config", error=TrainingError, missing=f"no training config at {str(path)!r}")
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except RecursionError:
        raise TrainingError(f"{str(path)!r}: tables and arrays nest too deep") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TrainingError(f"{str(path)!r} is not valid TOML: {exc}") from None
    return TrainConfig.from_dict(document, where=str(path))


# ------------------------------------------------------------------------------------------- validation

# Inclusive ranges of the integer fields: the upper bounds are far above any useful run and keep a typo
# from allocating without limit (replay_capacity states) or overflowing a 64-bit seed.
_INTS = {"num_groups": (1, 10_000), "mcts_iterations": (1, 10**6), "min_visits": (1, 10**6), "leaf_batch": (1, 4096),
         "games_per_round": (1, 10**5), "updates_per_round": (1, 10**5), "batch_size": (1, 1 << 16),
         "replay_capacity": (1, 10**7), "min_replay": (1, 10**7), "validation_instances": (0, 10**4),
         "validation_iterations": (1, 10**6), "total_steps": (0, 10**9), "workers": (0, 1024),
         "checkpoint_every": (1, 10**9), "validate_every": (1, 10**9), "log_every": (1, 10**9),
         "seed": (0, MAX_SEED)}
_FLOATS = {"c_puct": (0.0, 1e6), "root_noise": (0.0, 1.0), "noise_alpha": (1e-9, 1e6),
           "learning_rate": (1e-12, 10.0), "weight_decay": (0.0, 10.0), "grad_clip": (1e-12, 1e6)}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(config: TrainConfig) -> None:
    from tag.models import MODELS
    from tag.search.placement import FILLS, ORDERS

    for name, (least, most) in _INTS.items():
        value = getattr(config, name)
        if not _is_int(value) or not least <= value <= most:
            raise TrainingError(f"{name} must be an integer in {least}..{most}, got {value!r}")
    if config.replay_capacity < config.min_replay:  # the buffer would never hold enough to take a step
        raise TrainingError(f"replay_capacity ({config.replay_capacity}) must be at least min_replay "
                            f"({config.min_replay})")
    if config.min_visits > config.mcts_iterations:  # not even the root reaches it: games record no state
        raise TrainingError(f"min_visits ({config.min_visits}) must be at most mcts_iterations "
                            f"({config.mcts_iterations})")
    for name, (low, high) in _FLOATS.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise TrainingError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
    if not isinstance(config.models, tuple) or not config.models:
        raise TrainingError(f"models must be a non-empty list of zoo names, got {config.models!r}")
    for model in config.models:
        if not isinstance(model, str) or model not in MODELS:
            raise TrainingError(f"models: unknown zoo model {model!r} (known: {', '.join(MODELS)})")
    if not isinstance(config.tiny, bool):
        raise TrainingError(f"tiny must be true or false, got {config.tiny!r}")
    seeds = config.topology_seeds
    if (not isinstance(seeds, tuple) or len(seeds) != 2 or not all(map(_is_int, seeds))
            or not 0 <= seeds[0] < seeds[1]):
        raise TrainingError(f"topology_seeds must be [start, stop) with 0 <= start < stop, got {seeds!r}")
    if seeds[1] > EVAL_SEED_START:
        raise TrainingError(f"topology_seeds {list(seeds)} reach into the evaluation seeds (>= {EVAL_SEED_START})")
    _validate_families(config)
    if config.machines is not None and (not _is_int(config.machines) or not 1 <= config.machines <= 64):
        raise TrainingError(f"machines must be an integer in 1..64 or absent, got {config.machines!r}")
    if config.order not in ORDERS:
        raise TrainingError(f"order must be one of {', '.join(ORDERS)}, got {config.order!r}")
    if config.fill not in FILLS:
        raise TrainingError(f"fill must be one of {', '.join(FILLS)}, got {config.fill!r}")
    if config.init_policy is not None and (not isinstance(config.init_policy, str) or not config.init_policy):
        raise TrainingError(f"init_policy must be a policy checkpoint path or absent, got {config.init_policy!r}")
    if not isinstance(config.policy, PolicyConfig):
        raise TrainingError(f"policy must be a table of PolicyConfig fields, got {config.policy!r}")


def _validate_families(config: TrainConfig) -> None:
    families = config.topology_families
    if not isinstance(families, tuple) or not families or not all(isinstance(f, str) for f in families):
        raise TrainingError(f"topology_families must be a non-empty list of family names, got {families!r}")
    for family in families:
        if family not in FAMILIES:
            raise TrainingError(f"unknown topology family {family!r} (known: {', '.join(FAMILIES)})")
        if family in HELD_OUT:
            raise TrainingError(f"topology family {family!r} is held out for evaluation "
                                f"(held out: {', '.join(HELD_OUT)})")
    if len(set(families)) != len(families):
        raise TrainingError(f"topology_families lists a family twice: {list(families)}")
    if config.machines is not None and families != ("tag-random",):
        raise TrainingError("machines fixes tag-random's machine count; it cannot apply to other topology families")
