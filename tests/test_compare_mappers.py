"""scripts/compare_mappers.py: one small instance through every mapper, and the summary it reports."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tag.policy.mapping import resolve_mapping_policy

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_mappers.py"
spec = importlib.util.spec_from_file_location("compare_mappers", SCRIPT)
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


def test_every_mapper_maps_a_small_mesh_and_none_beats_the_proven_optimum():
    policy = resolve_mapping_policy(None)
    row = compare.run_instance("bert-large", "2d mesh", 16, 4, 5.0, 20, policy, 4, None)
    assert row["replicas"] == 4 and row["proven_optimal"]  # 4x4 mesh: the exact solver proves it at once
    for name in compare.MAPPERS:
        result = row[name]
        assert result["max_stage_time_s"] >= row["lower_bound_s"] * (1 - 1e-9), name
        assert 0.0 <= result["gap"] < 1.0 and result["solve_time_s"] >= 0.0, name
        expected = (result["max_stage_time_s"] - row["lower_bound_s"]) / result["max_stage_time_s"]
        assert np.isclose(result["gap"], max(expected, 0.0)), name
    assert row["exact"]["gap"] == 0.0
    for name in ("learned", "learned fast"):  # the CS map is among the learned mapper's candidates
        assert row[name]["max_stage_time_s"] <= row["CS"]["max_stage_time_s"] * (1 + 1e-12), name


def test_summary_takes_medians_per_device_count():
    rows = []
    for devices, gaps in ((8, (0.0, 0.2, 0.1)), (16, (0.3, 0.5, 0.4))):
        for k, gap in enumerate(gaps):
            row = {"devices": devices, "proven_optimal": k != 0}
            row.update({name: {"gap": gap, "solve_time_s": float(k + 1)} for name in compare.MAPPERS})
            rows.append(row)
    summary = compare.summarise(rows)
    assert list(summary) == [8, 16]
    assert summary[8]["learned fast"] == {"median_gap": 0.1, "median_time_s": 2.0}
    assert summary[16]["exact"]["median_gap"] == 0.4
    assert summary[16]["proven"] == {"count": 2, "of": 3}


def test_the_script_writes_its_report_and_ends_with_one_json_line(tmp_path):
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, str(SCRIPT), "--devices", "8", "--families", "2d torus", "--stages", "4",
                           "--time-limit", "2", "--mcts-iterations", "10", "--learned-iterations", "2",
                           "--out", str(out), "--json"], capture_output=True, text=True, cwd=ROOT, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(figures["summary"]["8"]) == set(compare.MAPPERS) | {"proven"}
    assert len(figures["instances"]) == 1
    assert "| learned fast gap |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report_gap.png").stat().st_size > 0 and (tmp_path / "report_time.png").stat().st_size > 0
