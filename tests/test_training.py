"""Self-play training (tag.training): config validation, a tiny run whose loss decreases, exact resume,
clear errors for corrupt or mismatched checkpoints, the ``tag train`` command."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch_geometric.data import HeteroData

from tag.cli import main
from tag.policy import build_policy, load_policy, policy_loss
from tag.training import (
    CHECKPOINT_NAME,
    EVAL_SEED_START,
    POLICY_NAME,
    VALIDATION_SEED_START,
    TrainConfig,
    TrainingError,
    game_instance,
    load_config,
    load_train_state,
    play_game,
    train,
    train_step,
    validation_instances,
)

TINY_TOML = Path(__file__).resolve().parents[1] / "training" / "configs" / "tiny.toml"


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny() -> TrainConfig:
    """Tiny graphs, 4 groups, 2 machines, 24 MCTS iterations per game, a 2-layer GNN of width 16."""
    return load_config(TINY_TOML).replace(total_steps=12, validation_instances=1, validate_every=1)


@pytest.fixture(scope="module")
def full_run(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, train(tiny, out)


# ------------------------------------------------------------------------------------------------ config


def test_config_file_and_fields(tiny, tmp_path):
    assert tiny.models == ("vgg19", "bert-small") and tiny.tiny and tiny.policy.hidden == 16
    assert TrainConfig.from_dict(tiny.to_dict()) == tiny
    shipped = load_config(TINY_TOML.with_name("tag.toml"))
    assert shipped.topology_seeds[1] <= EVAL_SEED_START < VALIDATION_SEED_START


@pytest.mark.parametrize("text, field", [
    ("num_groups = 0", "num_groups"),
    ("learning_rate = -1.0", "learning_rate"),
    ("models = ['no-such-model']", "no-such-model"),
    ("topology_seeds = [0, 1000001]", "evaluation seeds"),
    ("colour = 'red'", "colour"),
    ("order = 'random'", "order"),
    ("[policy]\nheads = 3", "heads"),
    ("num_groups = ", "not valid TOML"),
])
def test_bad_config_names_the_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(TrainingError, match=field):
        load_config(path)


def test_missing_config(tmp_path):
    with pytest.raises(TrainingError, match="no training config"):
        load_config(tmp_path / "absent.toml")


def test_instances_draw_from_disjoint_seeds(tiny):
    games = [game_instance(tiny, k)[0] for k in range(50)]
    assert all(0 <= g.topology_seed < EVAL_SEED_START for g in games)
    assert {g.model for g in games} == set(tiny.models)
    assert game_instance(tiny, 7)[0] == game_instance(tiny, 7)[0]
    assert all(v.topology_seed >= VALIDATION_SEED_START for v in validation_instances(tiny))


def test_init_policy_starts_from_its_weights(full_run, tiny, tmp_path):
    out, _ = full_run
    # one round with a negligible learning rate: the saved weights are the initial ones to 1e-9
    start = tiny.replace(init_policy=str(out / POLICY_NAME), total_steps=1, validation_instances=0,
                         learning_rate=1e-12)
    train(start, tmp_path / "fine")
    trained = load_policy(out / POLICY_NAME).model.state_dict()
    fine = load_policy(tmp_path / "fine" / POLICY_NAME).model.state_dict()
    assert all(torch.allclose(trained[k], v, rtol=0, atol=1e-9) for k, v in fine.items())
    fresh = build_policy(tiny.policy, seed=tiny.seed).state_dict()
    assert not all(torch.allclose(fresh[k], v, rtol=0, atol=1e-3) for k, v in fine.items())
    other = start.replace(policy=dataclasses.replace(tiny.policy, hidden=8))
    with pytest.raises(TrainingError, match="architecture"):
        train(other, tmp_path / "other")
    with pytest.raises(TrainingError, match="init_policy"):
        train(start.replace(init_policy=str(tmp_path / "absent.pt")), tmp_path / "absent")


# ----------------------------------------------------------------------------------------------- self-play


def test_game_records_visit_targets(tiny):
    record = play_game(tiny, build_policy(tiny.policy), 0)
    assert record.iterations == tiny.mcts_iterations and record.samples
    for sample in record.samples:
        data = HeteroData.from_dict(sample.data)
        assert sample.target.shape == (data["action"].num_nodes,)
        assert torch.isclose(sample.target.sum(), torch.tensor(1.0))
    again = play_game(tiny, build_policy(tiny.policy), 0)  # deterministic given the game index
    assert [s.target.tolist() for s in again.samples] == [s.target.tolist() for s in record.samples]


def test_train_step_fits_a_fixed_replay(tiny):
    replay = play_game(tiny, None, 1).samples + play_game(tiny, None, 2).samples
    model = build_policy(tiny.policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def loss() -> float:
        with torch.no_grad():
            return float(policy_loss(model, [HeteroData.from_dict(s.data) for s in replay],
                                     [s.target for s in replay]))

    before = loss()
    for step in range(15):
        train_step(model, optimizer, replay, tiny, step)
    assert loss() < before - 0.05


# ------------------------------------------------------------------------------------------------ the loop


def test_tiny_run_loss_decreases(full_run, tiny):
    out, summary = full_run
    assert summary.step == tiny.total_steps
    losses = [row["loss"] for row in summary.history if row.get("loss") is not None]
    assert len(losses) == tiny.total_steps // tiny.updates_per_round and losses[-1] < losses[0]
    assert summary.history[0]["val_uniform_iterations_to_beat"] >= 1
    assert (out / "tensorboard").is_dir() and any((out / "tensorboard").iterdir())
    history = json.loads((out / "history.json").read_text())
    assert [row["step"] for row in history] == [row["step"] for row in summary.history]
    policy = load_policy(out / POLICY_NAME)
    assert policy.step == tiny.total_steps and policy.config == tiny.policy


def test_resume_reproduces_the_uninterrupted_run(full_run, tiny, tmp_path):
    full_out, full = full_run
    # the run "interrupted" after its checkpoint at step 6; it played in a worker process, the rest does not:
    # games depend on their index only, so the worker count changes nothing
    half = train(tiny.replace(total_steps=6, workers=1), tmp_path)
    assert half.step == 6 and load_train_state(tmp_path / CHECKPOINT_NAME).games == tiny.games_per_round
    resumed = train(tiny, tmp_path, resume=True)
    assert resumed.step == full.step and resumed.games == full.games
    ours, theirs = load_train_state(tmp_path / CHECKPOINT_NAME), load_train_state(full_out / CHECKPOINT_NAME)
    for key, value in theirs.model.state_dict().items():
        assert torch.equal(ours.model.state_dict()[key], value), key
    assert [r.get("loss") for r in resumed.history] == [r.get("loss") for r in full.history]
    assert ours.optimizer["state"].keys() == theirs.optimizer["state"].keys()
    assert [s.target.tolist() for s in ours.replay] == [s.target.tolist() for s in theirs.replay]


def test_resume_through_the_cli_continues(tmp_path, capsys):
    args = ["train", "--config", str(TINY_TOML), "--out", str(tmp_path), "--json"]
    assert main(args + ["--steps", "6"]) == 0
    capsys.readouterr()
    assert main(args + ["--steps", "12", "--resume"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 12


# ------------------------------------------------------------------------------------------------- errors


def test_corrupt_checkpoint_is_a_clear_error(full_run, tiny, tmp_path):
    out, _ = full_run
    path = tmp_path / CHECKPOINT_NAME
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(TrainingError, match="not a readable training checkpoint"):
        load_train_state(path)
    path.write_bytes((out / CHECKPOINT_NAME).read_bytes()[:5000])  # truncated
    with pytest.raises(TrainingError, match="not a readable training checkpoint"):
        load_train_state(path)
    torch.save({"format": "something else"}, path)
    with pytest.raises(TrainingError, match="not a training checkpoint"):
        load_train_state(path)
    with pytest.raises(TrainingError, match="no training checkpoint"):
        load_train_state(tmp_path / "absent.pt")


def test_mismatched_checkpoint_names_the_fields(full_run, tiny):
    out, _ = full_run
    with pytest.raises(TrainingError, match="num_groups: checkpoint 4, config 5"):
        load_train_state(out / CHECKPOINT_NAME, tiny.replace(num_groups=5))
    state = load_train_state(out / CHECKPOINT_NAME, tiny.replace(total_steps=99, workers=2))  # runtime fields
    assert state.config.total_steps == 99 and state.config.workers == 2


def test_cli_errors(full_run, tmp_path, capsys):
    out, _ = full_run
    assert main(["train", "--config", str(TINY_TOML), "--out", str(out)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["train", "--config", str(TINY_TOML), "--out", str(tmp_path / "new"), "--resume"]) == 2
    assert "no training checkpoint" in capsys.readouterr().err
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"\x00" * 64)
    assert main(["train", "--config", str(TINY_TOML), "--out", str(tmp_path), "--resume"]) == 2
    assert "not a readable training checkpoint" in capsys.readouterr().err
