"""scripts/eval_generalization.py: the hold-out part (TAG Table 8) and its arguments, on canned search outcomes."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "eval_generalization.py"
spec = importlib.util.spec_from_file_location("eval_generalization", SCRIPT)
evalgen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evalgen)


class CannedRunner:
    """Runner.run's interface; outcomes by (method, model, topology index)."""

    budget = 10

    def __init__(self, speedups: dict[str, dict[str, list[float]]], first_beats: dict[str, list[int | None]]):
        self.speedups = speedups
        self.first_beats = first_beats
        self.policies = {m: (None, f"{m}-label") for m in speedups}

    def run(self, method, instances, *, stop_on_beat, budget=None):
        rows = []
        for k, inst in enumerate(instances):
            rows.append({"first_beat": self.first_beats[method][k], "speedup": self.speedups[method][inst.model][k],
                         "iterations": 10, "seconds": 0.1, "reference": "DP-NCCL"})
        return rows


def test_part_b_compares_each_held_out_policy_with_the_full_one_on_its_own_model():
    runner = CannedRunner(
        speedups={"uniform": {"vgg19": [1.0, 2.0], "bert-small": [1.0, 1.0]},
                  "gnn": {"vgg19": [1.5, 2.5], "bert-small": [1.2, 1.6]},
                  "holdout:vgg19": {"vgg19": [1.5, 1.5]}},
        first_beats={"uniform": [None, 4], "gnn": [2, 2], "holdout:vgg19": [3, None]})
    out = evalgen.part_b(runner, ["vgg19", "bert-small"], topologies=2)
    vgg, bert = out["models"]["vgg19"], out["models"]["bert-small"]
    assert vgg["uniform"] == pytest.approx(1.5) and vgg["gnn"] == pytest.approx(2.0)
    assert vgg["holdout"] == pytest.approx(1.5)
    assert vgg["holdout_over_full"] == pytest.approx(0.75)
    assert vgg["holdout_policy"] == "holdout:vgg19-label"
    # a miss counts as budget + 1
    assert vgg["uniform_iterations_to_beat"]["mean"] == pytest.approx((11 + 4) / 2)
    assert vgg["holdout_iterations_to_beat"]["misses"] == 1
    assert "holdout" not in bert and bert["gnn"] == pytest.approx(1.4)
    assert out["min_holdout_over_full"] == pytest.approx(0.75)
    assert out["mean_holdout_over_full"] == pytest.approx(0.75)


def test_holdout_arguments_name_their_problem():
    assert evalgen.parse_holdouts(["vgg19=runs/a/policy.pt", "bert-small=b.pt"]) == {
        "vgg19": "runs/a/policy.pt", "bert-small": "b.pt"}
    with pytest.raises(SystemExit, match="MODEL=POLICY"):
        evalgen.parse_holdouts(["runs/a/policy.pt"])
    with pytest.raises(SystemExit, match="vgg19 twice"):
        evalgen.parse_holdouts(["vgg19=a.pt", "vgg19=b.pt"])


def test_policy_labels_keep_the_run_folder():
    # hold-out runs all write policy.pt; the label is part of the result cache's key
    assert evalgen._label_path("runs/holdout-vgg19/policy.pt") == "holdout-vgg19/policy.pt"
    assert evalgen._label_path("policy.pt") == "policy.pt"
