"""The `tag` command: JSON contracts and one clear line for every bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_graph, run, run_json
from tag.cli import main
from tag.graph import graph_to_json, save_graph

PIPEDREAM = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _write_bytes(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _graph_file(tmp_path, name, mutate):
    doc = graph_to_json(make_graph([(0, 1), (1, 2)]))
    mutate(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def bad_inputs(tmp_path):
    """(argv, expected words in the message) for at least ten distinct kinds of bad input."""
    good_spec = "machines:\n  - {gpu: v100-32gb, count: 2, bandwidth: 100GB/s}\n"
    return {
        "cyclic graph": (["show", _graph_file(tmp_path, "cyc.json", lambda d: d["edges"].update(src=[0, 1, 2], dst=[1, 2, 0], bytes=[4.0, 4.0, 4.0], batch_scaled=[True] * 3))], "cycle"),
        "dangling edge": (["show", _graph_file(tmp_path, "dangle.json", lambda d: d["edges"].update(dst=[1, 9]))], "not an op"),
        "negative bytes": (["show", _graph_file(tmp_path, "neg.json", lambda d: d["edges"].update(bytes=[4.0, -1.0]))], "non-negative"),
        "wrong schema version": (["show", _graph_file(tmp_path, "v9.json", lambda d: d.update(schema_version=9))], "schema_version"),
        "unknown GPU type": (["show", "resnet101", "--cluster", _write(tmp_path / "gpu.yaml", good_spec.replace("v100-32gb", "v200"))], "v200"),
        "zero bandwidth": (["show", "resnet101", "--cluster", _write(tmp_path / "zero.yaml", good_spec.replace("100GB/s", "0GB/s"))], "bandwidth"),
        "disconnected cluster": (["show", "resnet101", "--cluster", _write(tmp_path / "disc.yaml", good_spec + "  - {gpu: t4, count: 1}\n")], "disconnected"),
        "unknown unit": (["show", "resnet101", "--cluster", _write(tmp_path / "unit.yaml", good_spec.replace("100GB/s", "100 Gbit"))], "Gbit"),
        "malformed graph.txt": (["show", _write(tmp_path / "bad.graph.txt", "node1 -- Input0 -- forward_compute_time=oops\n")], "bad.graph.txt:1"),
        "missing MODULE:FUNCTION": (["show", "no_such_module_xyz:build"], "no_such_module_xyz"),
        "unknown zoo model": (["show", "resnet9000"], "unknown model"),
        "unknown preset": (["show", "resnet101", "--cluster", "moon-base:4"], "moon-base"),
        "bad preset argument": (["show", "resnet101", "--cluster", "mesh2d:8y8"], "8y8"),
        "missing graph file": (["show", str(tmp_path / "nothing.json.gz")], "no such graph file"),
        "directory as graph": (["show", str(_mkdir(tmp_path / "dir.json"))], "is a directory"),
        "corrupt gzip": (["show", _write_bytes(tmp_path / "z.json.gz", b"\x1f\x8bgarbage")], "not valid gzip"),
        "meta not an object": (["show", _graph_file(tmp_path, "meta.json", lambda d: d.update(meta=[]))], "meta"),
        "bad meta parameters": (["show", _graph_file(tmp_path, "p.json", lambda d: d["meta"].update(parameters="abc"))], "meta.parameters"),
        "too many devices": (["show", "resnet101", "--cluster", "mesh2d:300x300"], "at most 4096"),
        "zero-width layer": (["show", _write(tmp_path / "zero.graph.txt", "node1 -- Input0 -- forward_compute_time=0, backward_compute_time=0, activation_size=-4, parameter_size=0\n")], "zero.graph.txt:1"),
        "out is a directory": (["trace", "resnet101", "--tiny", "--out", str(tmp_path)], "--out"),
    }


@pytest.mark.parametrize("case", [
    "cyclic graph", "dangling edge", "negative bytes", "wrong schema version", "unknown GPU type", "zero bandwidth",
    "disconnected cluster", "unknown unit", "malformed graph.txt", "missing MODULE:FUNCTION", "unknown zoo model",
    "unknown preset", "bad preset argument", "missing graph file", "directory as graph", "corrupt gzip",
    "meta not an object", "bad meta parameters", "too many devices", "zero-width layer", "out is a directory",
])
def test_bad_input_gives_one_line(capsys, tmp_path, case):
    argv, expected = bad_inputs(tmp_path)[case]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tag: error: ")
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err


def test_trace_leaves_nothing_half_written(capsys, tmp_path):
    out = tmp_path / "never.json.gz"
    code, _, err = run(capsys, "trace", "no_such_module_xyz:build", "--out", str(out))
    assert code == 2 and not out.exists() and not list(tmp_path.iterdir())


def test_show_json_contract(capsys):
    payload = run_json(capsys, "show", "bert-large", "--tiny", "--cluster", "tag-testbed")
    assert isinstance(payload["parameters"], int) and payload["parameters"] > 0
    assert set(payload["ops"]) >= {"forward", "backward", "optimizer"}
    assert all(payload["ops"][role] > 0 for role in ("forward", "backward", "optimizer"))
    assert payload["flops_per_iteration"] > 0 and payload["training_memory_bytes"] > 0
    assert {row["gpu"] for row in payload["fits_on"]} == {"v100-32gb", "1080ti", "p100"}


def test_show_graph_file_and_pipedream(capsys, tmp_path):
    path = tmp_path / "g.json.gz"
    save_graph(make_graph([(0, 1)], role=[0, 1]), path)
    assert run_json(capsys, "show", str(path))["ops"]["forward"] == 1
    if not PIPEDREAM.is_dir():  # the measured profiles live in shared/, beside the repository
        pytest.skip(f"no PipeDream profiles at {PIPEDREAM}")
    payload = run_json(capsys, "show", str(PIPEDREAM / "vgg16.graph.txt"))
    assert payload["ops"]["backward"] > 0 and payload["parameters"] > 100e6


def test_clusters_json_lists_device_counts(capsys):
    rows = run_json(capsys, "clusters")["clusters"]
    devices = {row["name"]: row["devices"] for row in rows}
    assert devices["tag-testbed"] == 16 and devices["tag-cloud"] == 32 and devices["dgx1x4"] == 32


def test_models_json_lists_the_zoo(capsys):
    names = {row["name"] for row in run_json(capsys, "models")["models"]}
    assert {"inception-v3", "resnet101", "resnet152", "vgg19", "transformer", "bert-small", "bert-large", "bert-36",
            "bert-48", "mmt", "dlrm", "candle-uno", "gpt2"} <= names


def test_trace_user_function(capsys, tmp_path):
    module = tmp_path / "mymodel.py"
    module.write_text(
        "import torch\n"
        "def build():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))\n"
        "    return model, (torch.randn(4, 8),), lambda out: out.square().mean()\n"
    )
    out = tmp_path / "g.json.gz"
    payload = run_json(capsys, "trace", f"{module}:build", "--out", str(out))
    assert out.exists() and payload["parameters"] == 8 * 16 + 16 + 16 * 2 + 2


def test_console_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "tag", "clusters", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["clusters"]


def test_json_output_has_no_nan_or_infinity(capsys, tmp_path):
    path = tmp_path / "huge.json"
    save_graph(make_graph([(0, 1)], flops=[1.7e308, 1.7e308]), path)
    payload = run_json(capsys, "show", str(path))
    assert payload["flops_per_iteration"] is None  # overflowed to infinity: written as null, not Infinity


def test_batch_size_must_be_positive(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["show", "resnet101", "--batch-size", "0"])
    assert stop.value.code == 2
    assert "1..2^31" in capsys.readouterr().err


# ------------------------------------------------------------------------------- simulate / baselines
def test_baselines_json_rows(capsys):
    payload = run_json(capsys, "baselines", "vgg19", "--tiny", "--cluster", "tag-testbed", "--num-groups", "8")
    rows = payload["baselines"]
    assert [row["baseline"] for row in rows] == ["dp-nccl", "dp-nccl-p", "horovod", "single-device", "metis-mp"]
    for row in rows:
        assert {"name", "iteration_time_s", "oom", "samples_per_s", "peak_memory_bytes"} <= set(row)
        assert isinstance(row["oom"], bool) and row["iteration_time_s"] > 0
        assert len(row["peak_memory_bytes"]) == 16
        assert row["samples_per_s"] == pytest.approx(payload["batch_size"] / row["iteration_time_s"])
    assert rows[0]["speedup"] == pytest.approx(1.0)


def test_baselines_only_subset_and_unknown_name(capsys):
    payload = run_json(capsys, "baselines", "vgg19", "--tiny", "--cluster", "tag-testbed", "--num-groups", "4",
                       "--only", "dp-nccl,horovod")
    assert [row["name"] for row in payload["baselines"]] == ["DP-NCCL", "Horovod"]
    code, _, err = run(capsys, "baselines", "vgg19", "--tiny", "--cluster", "tag-testbed", "--only", "dp-ncl")
    assert code == 2 and err.count("\n") == 1 and "dp-ncl" in err


def test_simulate_baseline_matches_baselines_and_writes_views(capsys, tmp_path):
    common = ("vgg19", "--tiny", "--cluster", "tag-testbed", "--num-groups", "8")
    table = run_json(capsys, "baselines", *common, "--only", "dp-nccl")["baselines"][0]
    trace, chart = tmp_path / "t.json", tmp_path / "g.png"
    payload = run_json(capsys, "simulate", *common, "--baseline", "dp-nccl", "--trace", str(trace),
                       "--gantt", str(chart))
    assert payload["iteration_time_s"] == pytest.approx(table["iteration_time_s"], rel=1e-12)
    assert payload["feasible"] and not payload["oom"]
    assert json.loads(trace.read_text())["traceEvents"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.png", "t.json"]  # no temporary files left


def test_simulate_plan_file_round_trip_and_mismatch(capsys, tmp_path):
    from tag.cluster import resolve_cluster
    from tag.compiler import compile_strategy
    from tag.graph.resolve import resolve_model
    from tag.grouping import group_ops
    from tag.strategy import Strategy, make_plan, save_plan

    graph = resolve_model("vgg19", tiny=True)
    cluster = resolve_cluster("tag-testbed")
    group_graph = group_ops(graph, num_groups=6, gpus=cluster)
    strategy = Strategy.data_parallel(6, cluster).with_group(0, [1, 0, 0, 0, 0, 0, 0], "duplicate")
    expected = compile_strategy(group_graph, strategy, cluster).simulate(feedback=False).iteration_time
    path = tmp_path / "plan.json"
    save_plan(make_plan(strategy, graph, cluster, assignment=group_graph.assignment), path)
    payload = run_json(capsys, "simulate", "vgg19", "--tiny", "--cluster", "tag-testbed", "--strategy", str(path))
    assert payload["iteration_time_s"] == pytest.approx(expected, rel=1e-12)
    code, _, err = run(capsys, "simulate", "vgg19", "--tiny", "--cluster", "tag-cloud", "--strategy", str(path))
    assert code == 2 and err.count("\n") == 1 and "made for cluster 'tag-testbed'" in err
    code, _, err = run(capsys, "simulate", "resnet101", "--tiny", "--cluster", "tag-testbed", "--strategy", str(path))
    assert code == 2 and err.count("\n") == 1 and "made for model" in err


@pytest.mark.parametrize("flag,name", [("--trace", "t.txt"), ("--gantt", "g.svg")])
def test_simulate_rejects_bad_view_path_before_work(capsys, tmp_path, flag, name):
    code, _, err = run(capsys, "simulate", "vgg19", "--tiny", "--cluster", "tag-testbed", "--baseline", "dp-nccl",
                       flag, str(tmp_path / name))
    assert code == 2 and err.count("\n") == 1 and flag in err
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------ the command's shape
def test_every_command_is_one_module_that_parses_and_runs():
    import argparse
    import importlib

    from tag.cli.main import COMMANDS, build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert list(commands) == list(COMMANDS)
    for name in COMMANDS:
        assert commands[name].get_default("func") is importlib.import_module(f"tag.cli.{name}").run


def test_plan_family_choices_are_the_planners_families():
    from tag.cli.plan import FAMILY_CHOICES, families_of
    from tag.planners import FAMILIES

    assert FAMILY_CHOICES == ("all", *FAMILIES, "graph")
    assert families_of("all") == FAMILIES and families_of("graph") == ("graph-pipeline",)
    assert families_of("pipeline") == ("pipeline",)


def test_python_dash_m_tag_is_the_command():
    result = subprocess.run([sys.executable, "-m", "tag", "models", "--json"], capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    assert "vgg19" in [row["name"] for row in json.loads(result.stdout)["models"]]


# ------------------------------------------------------------------------------------ 80-column reports
TINY = ("vgg19", "--tiny", "--cluster", "tag-testbed", "--num-groups", "8")
REPORTS = {  # the catalogues (models, clusters) wrap their descriptions: tested below
    "show": ["show", "vgg19", "--tiny", "--cluster", "tag-testbed"],
    "baselines": ["baselines", *TINY],
    "simulate": ["simulate", *TINY, "--baseline", "metis-mp"],
    "plan placement": ["plan", *TINY, "--family", "placement", "--budget", "3", "--uniform"],
    "plan data-parallel": ["plan", *TINY, "--family", "data-parallel"],
    "pipeline": ["pipeline", "vgg19", "--tiny", "--cluster", "tag-testbed", "--stages", "2", "--replicas", "8",
                 "--time-limit", "5"],
    "compare": pytest.param(["compare", *TINY, "--budget", "3", "--time-limit", "5", "--no-graphpipe"],
                            marks=pytest.mark.slow),
}


@pytest.mark.parametrize("argv", list(REPORTS.values()), ids=list(REPORTS))
def test_every_table_fits_80_columns_unwrapped(capsys, monkeypatch, argv):
    """A table whose widest layout (every cell on one line) is at most 80 columns never wraps a row in an
    80-column terminal; long prose lines may wrap, tables may not."""
    from rich.console import Console
    from rich.table import Table

    import tag.cli.report as report

    tables, console = [], report.console

    def recording():
        out = console()
        draw = out.print
        out.print = lambda *objects, **options: (tables.extend(o for o in objects if isinstance(o, Table)),
                                                 draw(*objects, **options))
        return out

    monkeypatch.setattr(report, "console", recording)
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert tables
    wide = Console(width=400)
    for table in tables:
        assert wide.measure(table).maximum <= report.WIDTH, (table.title, wide.measure(table).maximum)


def test_catalogues_keep_each_entry_on_its_first_line_at_80_columns(capsys, monkeypatch):
    """The model zoo and the presets wrap only their descriptions: name and figures stay on one line."""
    import re

    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run(capsys, "models")
    assert code == 0, err
    assert max(map(len, out.splitlines())) <= 80
    for row in run_json(capsys, "models")["models"]:
        assert re.search(rf"^{re.escape(row['name'])} +{row['batch_size']} +\S+ +\S", out, re.M), row["name"]
    code, out, err = run(capsys, "clusters")
    assert code == 0, err
    assert max(map(len, out.splitlines())) <= 80
    for row in run_json(capsys, "clusters")["clusters"]:
        assert re.search(rf"^{re.escape(row.get('address', row['name']))} +{row['devices']} +\S", out, re.M)


# ------------------------------------------------------------------------------ stored plans, rebuilt
def test_a_plan_without_its_grouping_is_regrouped_by_metis_or_refused(capsys, tmp_path):
    """A plan file that keeps only its grouping's fingerprint is simulated on METIS's grouping with the
    same seed; another seed, or a strategy with more rows than METIS makes groups, is one clear error."""
    from tag.cluster import resolve_cluster
    from tag.compiler import compile_strategy
    from tag.graph.resolve import resolve_model
    from tag.grouping import group_ops
    from tag.strategy import Strategy, grouping_fingerprint, make_plan, save_plan

    graph = resolve_model("vgg19", tiny=True)
    cluster = resolve_cluster("tag-testbed")
    group_graph = group_ops(graph, num_groups=6, gpus=cluster, seed=3)
    strategy = Strategy.data_parallel(6, cluster).with_group(1, [1, 0, 0, 0, 0, 0, 0], "duplicate")
    expected = compile_strategy(group_graph, strategy, cluster).simulate(feedback=False).iteration_time
    path = tmp_path / "plan.json"
    save_plan(make_plan(strategy, graph, cluster, grouping_fingerprint=grouping_fingerprint(group_graph.assignment)),
              path)
    common = ("vgg19", "--tiny", "--cluster", "tag-testbed", "--strategy", str(path))
    assert run_json(capsys, "simulate", *common, "--seed", "3")["iteration_time_s"] == pytest.approx(expected, rel=1e-12)
    regrouped = group_ops(graph, num_groups=6, gpus=cluster, seed=4)
    assert grouping_fingerprint(regrouped.assignment) != grouping_fingerprint(group_graph.assignment)
    code, _, err = run(capsys, "simulate", *common, "--seed", "4")
    assert code == 2 and err.count("\n") == 1 and "METIS (seed 4) groups this model differently" in err
    too_many = tmp_path / "rows.json"
    save_plan(make_plan(Strategy.data_parallel(10_000, cluster), graph, cluster, grouping_fingerprint="0" * 16),
              too_many)
    code, _, err = run(capsys, "simulate", "vgg19", "--tiny", "--cluster", "tag-testbed", "--strategy", str(too_many))
    assert code == 2 and err.count("\n") == 1 and "the plan has 10000 rows and no stored grouping" in err
