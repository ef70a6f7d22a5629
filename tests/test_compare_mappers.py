"""scripts/compare_mappers.py: one small instance through every mapper, and the summaries it reports."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tag.policy.mapping import resolve_mapping_policy

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_mappers.py"
spec = importlib.util.spec_from_file_location("compare_mappers", SCRIPT)
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


def test_every_mapper_maps_a_small_mesh_and_none_beats_the_proven_optimum():
    policy = resolve_mapping_policy(None)
    row = compare.run_instance("bert-large", "mesh", 16, 4, 5.0, 20, policy, 4, None, candidate=policy,
                               backtrack_dives=20)
    assert row["replicas"] == 4 and row["proven_optimal"]  # 4x4 mesh: the exact solver proves it at once
    for name in compare.MAPPERS + compare.CANDIDATES:
        result = row[name]
        assert result["max_stage_time_s"] >= row["lower_bound_s"] * (1 - 1e-9), name
        assert 0.0 <= result["gap"] < 1.0 and result["solve_time_s"] >= 0.0, name
        expected = (result["max_stage_time_s"] - row["lower_bound_s"]) / result["max_stage_time_s"]
        assert np.isclose(result["gap"], max(expected, 0.0)), name
    assert row["exact"]["gap"] == 0.0
    for name in compare.LEARNED:  # the CS map is among the learned mapper's candidates
        assert row[name]["max_stage_time_s"] <= row["CS"]["max_stage_time_s"] * (1 + 1e-12), name
    for setting in ("", " fast"):  # the same checkpoint twice: the same maps
        assert row["learned" + setting]["max_stage_time_s"] == row["candidate" + setting]["max_stage_time_s"]


def _rows():
    rows = []
    for devices, family, seed, gaps in ((8, "mesh", 0, (0.0, 0.2, 0.1)), (16, "mesh", 0, (0.3, 0.5, 0.4)),
                                        (16, "nvlink", 1, (0.7, 0.9, 0.8))):
        for k, gap in enumerate(gaps):
            row = {"devices": devices, "family": family, "topology_seed": seed, "proven_optimal": k != 0}
            row.update({name: {"gap": gap, "solve_time_s": float(k + 1)} for name in compare.MAPPERS})
            row["exact"] = {"gap": 0.0, "solve_time_s": 10.0 * (k + 1)}
            rows.append(row)
    return rows


def test_summary_takes_medians_per_device_count():
    summary = compare.summarise(_rows())
    assert list(summary) == [8, 16]
    assert summary[8]["learned fast"] == {"median_gap": 0.1, "median_time_s": 2.0}
    assert summary[16]["learned"]["median_gap"] == 0.6  # median of 0.3, 0.5, 0.4, 0.7, 0.9, 0.8
    assert summary[16]["proven"] == {"count": 4, "of": 6}


def test_per_family_medians_and_the_pooled_time_ratio():
    families = compare.by_family(_rows())
    assert list(families) == ["nvlink", "mesh"]  # tag.cluster.families' order
    assert families["mesh"][16]["learned"] == 0.4 and families["nvlink"][16]["learned"] == 0.8
    assert families["mesh"][8]["proven"] == 2 and families["mesh"][8]["of"] == 3
    ratio = compare.time_ratio(_rows(), devices=16)
    assert ratio["instances"] == 6 and ratio["seeds"] == [0, 1]
    assert ratio["exact_median_time_s"] == 20.0 and ratio["learned fast"]["ratio"] == 10.0
    assert compare.time_ratio(_rows(), devices=64) == {}


def test_families_a_checkpoint_was_not_trained_on_come_from_its_meta(tmp_path):
    from tag.policy.mapping import MappingPolicy, MappingPolicyConfig, save_mapping_policy

    policy = MappingPolicy(MappingPolicyConfig(hidden=8, heads=1, num_layers=1))
    save_mapping_policy(tmp_path / "named.pt", policy, meta={"train_config": {"families": ["2d mesh", "nvlink"]}})
    save_mapping_policy(tmp_path / "unnamed.pt", policy, meta={"train_config": {}})
    assert compare.untrained(tmp_path / "named.pt") == [f for f in compare.FAMILIES if f not in ("mesh", "nvlink")]
    assert compare.untrained(tmp_path / "unnamed.pt") == ["nvlink", "mixed-gen"]  # the Parmesan and TAG families


def test_the_script_writes_its_report_and_ends_with_one_json_line(tmp_path):
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, str(SCRIPT), "--devices", "8", "--families", "torus", "--stages", "4",
                           "--time-limit", "2", "--mcts-iterations", "10", "--learned-iterations", "2",
                           "--backtrack-dives", "8", "--out", str(out), "--json"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(figures["summary"]["8"]) == set(compare.MAPPERS) | {"proven"}
    assert len(figures["instances"]) == 1 and set(figures["by_family"]) == {"torus"}
    assert figures["held_out"] == compare.untrained(None)
    text = (tmp_path / "report.md").read_text()
    assert "| learned fast gap |" in text and "| torus |" in text
    assert (tmp_path / "report_gap.png").stat().st_size > 0 and (tmp_path / "report_time.png").stat().st_size > 0


def test_bad_arguments_are_one_error_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--devices", "4", "--stages", "8", "--out",
                           str(tmp_path / "r"), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.startswith("tag: error:") and len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["--mcts-iterations", "-1"], "--mcts-iterations must be at least 1, got -1"),
    (["--mcts-iterations", "0"], "--mcts-iterations must be at least 1, got 0"),
    (["--learned-iterations", "-1"], "--learned-iterations must be non-negative, got -1"),
    (["--learned-discrepancies", "-2"], "--learned-discrepancies must be non-negative, got -2"),
    (["--backtrack-dives", "-1"], "--backtrack-dives must be non-negative, got -1"),
    (["--time-limit", "0"], "--time-limit must be a positive number of seconds, got 0.0"),
    (["--time-limit", "nan"], "--time-limit must be a positive number of seconds, got nan"),
    (["--time-limit", "inf"], "--time-limit must be a positive number of seconds, got inf"),
    (["--devices", "1"], "every device count must be at least 2 and at least every depth ([4, 8]), got 1"),
    (["--devices", "16", "-4"], "every device count must be at least 2 and at least every depth ([4, 8]), got -4"),
    (["--stages", "0"], "every depth (--stages) must be at least 1, got 0"),
    (["--topology-seeds", "-1"], "topology seeds must be non-negative, got -1"),
    (["--ratio-seeds", "1", "-3"], "topology seeds must be non-negative, got -3"),
])
def test_each_bad_number_is_named_in_one_error_line(tmp_path, capsys, argv, message):
    """Checked in main() before any policy is loaded or any instance run (these used to be tracebacks
    from deep inside a mapper)."""
    assert compare.main([*argv, "--out", str(tmp_path / "r"), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"tag: error: {message}\n"
    assert not (tmp_path / "r.md").exists()


def test_the_ratio_seeds_help_says_they_join_the_gap_tables():
    text = " ".join(compare._parser().format_help().split())
    assert "--ratio-seeds" in text and "join the 64-device rows of the gap tables and the time ratio" in text
