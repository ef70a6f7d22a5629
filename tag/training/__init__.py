"""Self-play training of the TAG policy (TAG §4.2.2, §5.2) and the ``tag train`` command.

:func:`train` plays games on random (model, topology) pairs with MCTS guided by the current GNN, keeps
the visit-count targets of well-visited vertices in a replay buffer and fits the GNN to them by
cross-entropy; :class:`TrainConfig` (read from TOML by :func:`load_config`) says everything it does.
"""

from typing import Any

# Public names → the submodule that defines them. Imported on first use, so that `tag --help` and the
# other commands do not pay for torch when they register `tag train`.
_EXPORTS = {
    "tag.training.config": ("TrainConfig", "load_config", "EVAL_SEED_START", "VALIDATION_SEED_START",
                            "RUNTIME_FIELDS"),
    "tag.training.errors": ("TrainingError",),
    "tag.training.loop": ("train", "train_step", "TrainSummary", "CHECKPOINT_NAME", "POLICY_NAME", "HISTORY_NAME"),
    "tag.training.selfplay": ("Instance", "Sample", "GameRecord", "Outcome", "SelfPlayPool", "build_instance",
                              "game_instance", "play_game", "search_instance", "validation_instances"),
    "tag.training.state": ("TrainState", "load_train_state", "save_train_state"),
    "tag.training.cli": ("add_train_parser", "cmd_train"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [name for names in _EXPORTS.values() for name in names]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'tag.training' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
