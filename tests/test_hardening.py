"""Adversarial input to every file type and command (issue 34): one ``tag: error:`` line naming the problem,
exit status 2, no traceback, no hang, no unbounded allocation, and no output file left behind.

Each case runs the CLI in-process; ``capfd`` also catches what torch's own log handlers write to fd 2.
"""

import gzip
import json
import os
from pathlib import Path

import pytest
import torch

from conftest import make_graph
from tag.cli import main
from tag.graph import graph_to_json

TOY = str(Path(__file__).resolve().parents[1] / "examples" / "toy4.yaml")
SPEC = "machines:\n  - {gpu: v100-32gb, count: 2, bandwidth: 100GB/s}\n"
LONG = "a" * 300  # one path component longer than NAME_MAX (255)


def run_cli(capfd, *argv):
    """`tag ARGV` in-process: (exit code, stdout, stderr); argparse's exit counts as a return."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    out, err = capfd.readouterr()
    return code, out, err


def assert_one_line(capfd, argv, *words, folder: Path | None = None, before: set | None = None):
    """Exit 2 with exactly one `tag: error:` line holding ``words``; nothing new in ``folder``."""
    code, out, err = run_cli(capfd, *argv)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("tag: error: "), err
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in err and "usage: tag" not in err  # argparse's block (a preset's usage is one line)
    if folder is not None:
        assert {p.name for p in folder.iterdir()} == (before or set()), "an output file was left behind"
    return lines[0]


def write(path: Path, text: str | bytes) -> str:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def graph_doc(**meta) -> dict:
    doc = graph_to_json(make_graph([(0, 1), (1, 2)]))
    doc["meta"].update(meta)
    return doc


# ------------------------------------------------------------------------------------ 1. deep nesting
@pytest.mark.parametrize("name, text", [
    ("deep.json", '{"name": ' + "[" * 100_000 + "]" * 100_000 + "}"),  # past Python's recursion limit
    ("deep200.json", '{"name": "x", "description": ' + "[" * 200 + "]" * 200 + "}"),  # under it
    ("deep.yaml", "name: " + "[" * 100_000 + "]" * 100_000 + "\n"),
    ("deep900.yaml", "name: " + "[" * 900 + "]" * 900 + "\n"),
    ("block.yaml", "".join(" " * i + "a:\n" for i in range(300))),  # nesting by indentation
    ("alias.yaml", "description: [&a0 [1], " + ", ".join(f"&a{i} [*a{i - 1}]" for i in range(1, 100)) + "]\n"),
])
def test_deeply_nested_cluster_spec(capfd, tmp_path, name, text):
    assert_one_line(capfd, ["show", "resnet101", "--cluster", write(tmp_path / name, text)], name, "nest more than")


def test_yaml_aliases_that_hold_themselves_or_blow_up(capfd, tmp_path):
    spec = write(tmp_path / "self.yaml", "description: &a [*a]\n" + SPEC)
    assert_one_line(capfd, ["show", "resnet101", "--cluster", spec], "self.yaml", "contains itself")
    laughs = ["&x0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&x{i} [" + ", ".join([f"*x{i - 1}"] * 10) + "]"
                                                         for i in range(1, 30)]
    spec = write(tmp_path / "laughs.yaml", f"name: lol\ndescription: [{', '.join(laughs)}]\n" + SPEC)
    code, out, err = run_cli(capfd, "show", "resnet101", "--cluster", spec)  # 10^30 leaves, 30 lists: quick
    assert code == 0 and "lol" in out, err


def test_deeply_nested_graph_and_plan(capfd, tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    graph = write(tmp_path / "g.json", json.dumps(graph_doc()).replace('"meta": {', '"meta": {"x": ' + deep + ", ", 1))
    assert_one_line(capfd, ["show", graph], "g.json", "nest more than")
    nested = json.dumps(graph_doc(deep=json.loads("[" * 100 + "]" * 100)))
    assert_one_line(capfd, ["show", write(tmp_path / "g100.json", nested)], "g100.json", "nest more than")
    plan = write(tmp_path / "plan.json", '{"format": "tag.plan", "kind": ' + deep + "}")
    assert_one_line(capfd, ["simulate", "vgg19", "--tiny", "--cluster", TOY, "--strategy", plan], "plan.json", "nest")


def test_deeply_nested_train_config(capfd, tmp_path):
    config = write(tmp_path / "c.toml", "models = " + "[" * 1500 + "]" * 1500 + "\n")  # past the recursion limit
    assert_one_line(capfd, ["train", "--config", config, "--out", tmp_path / "run"], "c.toml", "nest")


# ------------------------------------------------------------------------------- 2. huge counts, seeds
@pytest.mark.parametrize("machine, field", [
    ("{gpu: v100-32gb, count: 1, repeat: 100000000000000000000000}", "machines[0].repeat"),
    ("{gpu: v100-32gb, count: 100000000000000000000000, bandwidth: 10GB/s}", "machines[0].count"),
    ("{gpu: v100-32gb, count: 1, repeat: 1000000000}", "machines[0].repeat"),  # no 8 GB list first
    ("{gpu: v100-32gb, count: 8, bandwidth: 10GB/s, repeat: 1000}", "8,000 devices"),
])
def test_huge_counts_in_a_cluster_spec(capfd, tmp_path, machine, field):
    spec = write(tmp_path / "big.yaml", f"network: 10GB/s\nmachines:\n  - {machine}\n")
    assert_one_line(capfd, ["show", "resnet101", "--cluster", spec], field)


def test_saved_cluster_with_an_id_past_64_bits(capfd, tmp_path):
    from tag.cluster import resolve_cluster

    doc = resolve_cluster(TOY).to_json()
    doc["device_type"][0] = 10**30
    path = write(tmp_path / "saved.json", json.dumps(doc))
    assert_one_line(capfd, ["show", "resnet101", "--cluster", path], "saved.json", "device_type", "64-bit")


@pytest.mark.parametrize("preset", ["local:100000000000000000000", "local:1000000000", "mesh2d:100000x100000"])
def test_huge_preset_sizes(capfd, preset):
    assert_one_line(capfd, ["show", "resnet101", "--cluster", preset], "at most 4096")


@pytest.mark.parametrize("seed", [str(2**63), str(10**30), "-1"])
def test_seed_out_of_range(capfd, seed):
    assert_one_line(capfd, ["baselines", "vgg19", "--tiny", "--cluster", TOY, "--seed", seed], "--seed", "0..2^63-1")


def test_train_config_seed_out_of_range(capfd, tmp_path):
    config = write(tmp_path / "c.toml", "seed = 100000000000000000000\n")
    assert_one_line(capfd, ["train", "--config", config, "--out", tmp_path / "run"], "seed", "0..")


# ------------------------------------------------------------------------------------ 3. unbounded sizes
def _policy_checkpoint(path: Path, config: dict) -> str:
    from tag.policy.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
    from tag.policy.features import FEATURE_VERSION

    torch.save({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "feature_version": FEATURE_VERSION,
                "config": config, "model": {}, "optimizer": None, "step": 0}, path)
    return str(path)


def _mapping_checkpoint(path: Path, config: dict) -> str:
    import tag.policy.mapping.checkpoint as mapping

    payload = {"format": mapping.CHECKPOINT_FORMAT, "version": mapping.CHECKPOINT_VERSION,
               "feature_version": mapping.MAPPING_FEATURE_VERSION, "config": config, "model": {}, "step": 0}
    payload.update({key: None for key in mapping._REQUIRED if key not in payload})
    torch.save(payload, path)
    return str(path)


def test_policy_checkpoint_with_a_huge_width(capfd, tmp_path):
    policy = _policy_checkpoint(tmp_path / "p.pt", {"hidden": 2**22, "heads": 4, "num_layers": 4, "gamma_same": 1.0,
                                                    "gamma_cross": 0.1, "decoder_hidden": 64})
    assert_one_line(capfd, ["plan", "vgg19", "--tiny", "--cluster", TOY, "--policy", policy], "hidden", "1..512")


def test_mapping_checkpoint_with_a_huge_width(capfd, tmp_path):
    policy = _mapping_checkpoint(tmp_path / "m.pt", {"hidden": 2**22, "heads": 4, "num_layers": 3})
    assert_one_line(capfd, ["pipeline", "vgg19", "--tiny", "--cluster", TOY, "--stages", "2", "--replicas", "1",
                            "--mapper", "learned", "--mapper-policy", policy], "hidden", "1..512")


def test_train_config_with_a_huge_width(capfd, tmp_path):
    config = write(tmp_path / "c.toml", "[policy]\nhidden = 4194304\n")
    assert_one_line(capfd, ["train", "--config", config, "--out", tmp_path / "run"], "hidden", "1..512")


@pytest.fixture(scope="module")
def pipeline_plan(tmp_path_factory):
    """A 2-stage pipeline plan of vgg19-tiny (batch 4) on the toy cluster."""
    plan = tmp_path_factory.mktemp("pipeline") / "plan.json"
    code = main(["pipeline", "vgg19", "--tiny", "--cluster", TOY, "--stages", "2", "--replicas", "1",
                 "--micro-batches", "2", "--time-limit", "5", "--out", str(plan), "--json"])
    assert code == 0
    return json.loads(plan.read_text())


@pytest.mark.parametrize("micro_batches, words", [
    (10**9, ("1..4096",)), (10**30, ("1..4096",)), (5, ("exceed the batch of 4",)),
])
def test_pipeline_plan_with_more_micro_batches_than_samples(capfd, tmp_path, pipeline_plan, micro_batches, words):
    doc = json.loads(json.dumps(pipeline_plan))
    doc["pipeline"]["micro_batches"] = micro_batches
    plan = write(tmp_path / "plan.json", json.dumps(doc))
    assert_one_line(capfd, ["simulate", "vgg19", "--tiny", "--cluster", TOY, "--strategy", plan],
                    "pipeline.micro_batches", *words)


def test_pipeline_micro_batches_flag_is_bounded(capfd):
    assert_one_line(capfd, ["pipeline", "vgg19", "--tiny", "--cluster", TOY, "--batch-size", str(2**31),
                            "--micro-batches", "1000000000"], "--micro-batches", "1..4096")


@pytest.fixture(scope="module")
def strategy_plan(tmp_path_factory):
    """A plan file of vgg19-tiny in 4 op groups on the toy cluster (a 3-iteration search)."""
    plan = tmp_path_factory.mktemp("plan") / "plan.json"
    code = main(["plan", "vgg19", "--tiny", "--cluster", TOY, "--family", "placement", "--budget", "3", "--uniform",
                 "--num-groups", "4", "--out", str(plan), "--json"])
    assert code == 0
    return json.loads(plan.read_text())


@pytest.mark.parametrize("field, value, words", [
    ("fusion_bytes", "x", ("summary.fusion_bytes",)),
    ("fusion_bytes", 1e-300, ("summary.fusion_bytes",)),
    ("sfb_groups", "abc", ("summary.sfb_groups",)),
    ("sfb_groups", [10**30], ("summary.sfb_groups[0]", "64-bit")),
    ("sfb_groups", [4], ("summary.sfb_groups", "0..3")),
])
def test_plan_summary_fields_that_simulate_reads(capfd, tmp_path, strategy_plan, field, value, words):
    doc = json.loads(json.dumps(strategy_plan))
    doc["summary"][field] = value
    plan = write(tmp_path / "plan.json", json.dumps(doc))
    assert_one_line(capfd, ["simulate", "vgg19", "--tiny", "--cluster", TOY, "--strategy", plan], *words)


def test_pipeline_plan_with_a_foreign_reference_gpu(capfd, tmp_path, pipeline_plan):
    doc = json.loads(json.dumps(pipeline_plan))
    doc["pipeline"]["reference_gpu"] = "h100"
    plan = write(tmp_path / "plan.json", json.dumps(doc))
    assert_one_line(capfd, ["simulate", "vgg19", "--tiny", "--cluster", TOY, "--strategy", plan], "reference_gpu")


def test_gzip_that_inflates_past_the_bound(capfd, tmp_path, monkeypatch):
    monkeypatch.setattr("tag._read.MAX_INPUT_BYTES", 1 << 20)
    bomb = write(tmp_path / "bomb.json.gz", gzip.compress(b" " * (3 << 20)))  # 3 MiB of JSON whitespace
    assert_one_line(capfd, ["show", bomb], "bomb.json.gz", "inflates to more than 1,048,576 bytes")
    big = write(tmp_path / "big.json", b" " * ((1 << 20) + 1))
    assert_one_line(capfd, ["show", big], "big.json", "at most 1,048,576")


@pytest.mark.parametrize("edit, words", [
    (lambda doc: doc["ops"]["param_bytes"].__setitem__(0, 1e308), ("op0", "param_bytes", "2^100")),
    (lambda doc: doc["edges"]["bytes"].__setitem__(0, 1e300), ("'op0' -> 'op1'", "2^100")),
])
def test_byte_counts_that_would_overflow_the_memory_model(capfd, tmp_path, edit, words):
    doc = graph_doc()
    edit(doc)
    graph = write(tmp_path / "g.json", json.dumps(doc))
    assert_one_line(capfd, ["baselines", graph, "--cluster", TOY, "--num-groups", "2"], "g.json", *words)


# --------------------------------------------------------------------------- 4. training that never ends
@pytest.mark.parametrize("text, words", [
    ("updates_per_round = 0\n", ("updates_per_round", "1..")),
    ("replay_capacity = 8\nmin_replay = 16\n", ("replay_capacity (8)", "min_replay (16)")),
    ("mcts_iterations = 10\nmin_visits = 12\n", ("min_visits (12)", "mcts_iterations (10)")),
    ("learning_rate = inf\n", ("learning_rate",)),
    ("models = [[1]]\n", ("models", "unknown zoo model")),
])
def test_train_config_that_never_finishes(capfd, tmp_path, text, words):
    config = write(tmp_path / "c.toml", text)
    assert_one_line(capfd, ["train", "--config", config, "--out", tmp_path / "run"], *words)


def test_train_out_that_cannot_be_a_run_folder(capfd, tmp_path):
    config = write(tmp_path / "c.toml", "tiny = true\n")
    taken = write(tmp_path / "taken", "mine")
    before = {"c.toml", "taken"}
    assert_one_line(capfd, ["train", "--config", config, "--out", taken], "--out", "not a folder",
                    folder=tmp_path, before=before)
    assert_one_line(capfd, ["train", "--config", config, "--out", f"{taken}/run"], "--out", "cannot write into",
                    folder=tmp_path, before=before)
    assert_one_line(capfd, ["train", "--config", config, "--out", ""], "--out", folder=tmp_path, before=before)
    assert Path(taken).read_text() == "mine"


# ------------------------------------------------------------------------------ 5. paths that fail stat
@pytest.mark.parametrize("argv, words", [
    (["show", f"{LONG}.json"], ("File name too long",)),
    (["show", "resnet101", "--cluster", f"{LONG}.yaml"], ("File name too long",)),
    (["show", f"{LONG}.graph.txt"], ("File name too long",)),
    (["show", f"{LONG}.py:build"], ("File name too long",)),
    (["show", LONG], ("unknown model",)),
    (["simulate", "vgg19", "--tiny", "--cluster", TOY, "--strategy", f"{LONG}.json"], ("File name too long",)),
    (["plan", "vgg19", "--tiny", "--cluster", TOY, "--policy", f"{LONG}.pt"], ("File name too long",)),
    (["train", "--config", f"{LONG}.toml"], ("File name too long",)),
    (["plan", "vgg19", "--tiny", "--cluster", TOY, "--out", f"{LONG}/plan.json"], ("--out", "File name too long")),
    (["train", "--config", TOY, "--out", f"{LONG}/run"], ("--out", "File name too long")),
])
def test_names_the_os_refuses(capfd, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    assert_one_line(capfd, argv, *words, folder=tmp_path)


def test_paths_that_cannot_be_read(capfd, tmp_path):
    file = write(tmp_path / "file", "x")
    assert_one_line(capfd, ["show", f"{file}/g.json"], "Not a directory")
    assert_one_line(capfd, ["show", "resnet101", "--cluster", f"{file}/c.yaml"], "Not a directory")
    assert_one_line(capfd, ["train", "--config", str(tmp_path)], "is a directory")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it would block until a writer comes: refused, never read
    assert_one_line(capfd, ["simulate", "vgg19", "--tiny", "--cluster", TOY, "--strategy", fifo], "not a regular file")
    assert_one_line(capfd, ["show", fifo], "not a regular file")
    toml = tmp_path / "fifo.toml"
    os.mkfifo(toml)
    assert_one_line(capfd, ["train", "--config", toml], "not a regular file")


def test_control_characters_in_a_name_stay_on_one_line(capfd, tmp_path):
    line = assert_one_line(capfd, ["show", str(tmp_path / "a\nb\rc\x1b[31m.json")], "no such graph file")
    assert "\x1b" not in line and "\r" not in line


# ------------------------------------------------------------------------------------- 6. rich markup
def test_markup_in_names_prints_as_written(capfd, tmp_path):
    spec = write(tmp_path / "c.yaml", 'name: "[/]"\n' + SPEC)
    code, out, err = run_cli(capfd, "show", "resnet101", "--cluster", spec)
    assert code == 0 and "Fit on [/]" in out, err
    graph = write(tmp_path / "g.json", json.dumps(graph_doc(model="[bold]x[/]")))
    code, out, err = run_cli(capfd, "show", graph)
    assert code == 0 and "[bold]x[/]" in out, err
    plan = tmp_path / "p.json"
    code, out, err = run_cli(capfd, "plan", "vgg19", "--tiny", "--cluster", spec, "--budget", "3", "--uniform",
                             "--num-groups", "4", "--out", plan)
    assert code == 0 and "on [/]" in out and plan.is_file(), err


# ----------------------------------------------------------------------------------- 7. sys.exit in user code
USER = """import sys
import torch
from torch import nn

class Exits(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        sys.exit(5)

def exits_in_function():
    sys.exit(3)

def exits_quietly():
    sys.exit(0)

def exits_in_forward():
    return Exits(), (torch.randn(2, 4),), lambda out: out.sum()
"""


@pytest.mark.parametrize("function, words", [
    ("exits_in_function", ("exits_in_function", "sys.exit(3)")),
    ("exits_quietly", ("exits_quietly", "sys.exit(0)")),
    ("exits_in_forward", ("exits_in_forward", "sys.exit(5)")),
])
def test_user_code_that_calls_sys_exit(capfd, tmp_path, function, words):
    user = write(tmp_path / "user.py", USER)
    assert_one_line(capfd, ["show", f"{user}:{function}"], *words)


def test_user_module_that_exits_at_import(capfd, tmp_path):
    user = write(tmp_path / "quits.py", "import sys\nsys.exit(0)\n")
    assert_one_line(capfd, ["trace", f"{user}:build", "--out", tmp_path / "g.json"], "importing it", "sys.exit(0)",
                    folder=tmp_path, before={"quits.py"})


def test_user_code_that_prints_leaves_json_clean(capfd, tmp_path):
    user = write(tmp_path / "chatty.py", "import torch\nfrom torch import nn\nprint('at import')\n\n"
                 "class Chatty(nn.Linear):\n    def forward(self, x):\n        print('in forward')\n"
                 "        return super().forward(x)\n\n"
                 "def build():\n    print('in build')\n    return Chatty(4, 2), (torch.randn(2, 4),), lambda out: out.sum()\n")
    code, out, err = run_cli(capfd, "show", f"{user}:build", "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == "build"
    assert "at import" in err and "in build" in err and "in forward" in err


# --------------------------------------------------------------------------------- 8. all outputs or none
def test_a_failed_view_leaves_no_other_output(capfd, tmp_path, monkeypatch):
    def broken_gantt(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tag.sim.trace.gantt", broken_gantt)
    outputs = ["--out", tmp_path / "new" / "sub" / "plan.json", "--trace", tmp_path / "t.json",
               "--gantt", tmp_path / "g.png"]  # and no folder made for the plan is left either
    assert_one_line(capfd, ["pipeline", "vgg19", "--tiny", "--cluster", TOY, "--stages", "2", "--replicas", "1",
                            "--micro-batches", "2", *outputs], "--gantt", "No space left", folder=tmp_path)
    assert_one_line(capfd, ["simulate", "vgg19", "--tiny", "--cluster", TOY, "--baseline", "dp-nccl", "--num-groups",
                            "4", *outputs[2:]], "--gantt", folder=tmp_path)


def test_outputs_land_together(capfd, tmp_path):
    outputs = [tmp_path / "plan.json", tmp_path / "t.json"]
    code, _, err = run_cli(capfd, "pipeline", "vgg19", "--tiny", "--cluster", TOY, "--stages", "2", "--replicas", "1",
                           "--micro-batches", "2", "--out", outputs[0], "--trace", outputs[1])
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "t.json"]  # no staged name left


# ------------------------------------------------------------------------------------ 9. argument errors
@pytest.mark.parametrize("argv, words", [
    ([], ("COMMAND",)),
    (["plan", "vgg19", "--cluster", TOY, "--bogus"], ("unrecognized arguments: --bogus",)),
    (["show"], ("show:", "MODEL")),
    (["train", "--config", "c.toml", "--steps", "0"], ("--steps", "1..10^9")),
    (["train", "--config", "c.toml", "--steps", "-1"], ("--steps", "1..10^9")),
    (["train", "--config", "c.toml", "--workers", "-1"], ("--workers", "0..1024")),
    (["run", "plan.json"], ("run:", "--model")),
    (["pipeline", "vgg19", "--cluster", TOY, "--schedule", "zigzag"], ("--schedule", "zigzag")),
    (["models", "extra\nline"], ("unrecognized arguments: extra line",)),
])
def test_argument_errors_are_one_line(capfd, argv, words):
    assert_one_line(capfd, argv, *words)


# ------------------------------------------------------------------------------------------- 10. noise
def test_a_kernel_failure_in_tracing_is_one_line(capfd, tmp_path):
    user = write(tmp_path / "mm.py", "import torch\nfrom torch import nn\n\n"
                 "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                 "        self.layer = nn.Linear(4, 4)\n\n    def forward(self, x):\n"
                 "        return self.layer(x) @ torch.ones(5, 5)\n\n"
                 "def build():\n    return M(), (torch.randn(2, 4),), lambda out: out.sum()\n")
    assert_one_line(capfd, ["show", f"{user}:build"], "cannot trace the train step: RuntimeError")


def test_a_refused_pickle_names_the_global(capfd, tmp_path):
    class Evil:
        def __reduce__(self):
            return os.system, ("true",)

    torch.save({"format": "tag.policy", "model": Evil()}, tmp_path / "evil.pt")
    assert_one_line(capfd, ["plan", "vgg19", "--tiny", "--cluster", TOY, "--policy", tmp_path / "evil.pt"],
                    "Unsupported global: posix.system")


@pytest.mark.parametrize("spec, field", [
    (SPEC.replace("100GB/s", "1e-300"), "machines[0].bandwidth"),
    (SPEC.replace("100GB/s", "1e300"), "machines[0].bandwidth"),
    ("network: {bandwidth: 1e-300}\nmachines:\n  - {gpu: t4}\n  - {gpu: t4}\n", "network.bandwidth"),
    ("gpus:\n  slow: {memory: 16GiB, memory_bandwidth: 900GB/s, fp32: 1e-300}\n" + SPEC.replace("v100-32gb", "slow"),
     "gpus.slow.fp32"),
    ("gpus:\n  slow: {memory: 16GiB, memory_bandwidth: 1e-300, fp32: 10TFLOPS}\n" + SPEC.replace("v100-32gb", "slow"),
     "gpus.slow.memory_bandwidth"),
])
def test_absurd_speeds_name_the_spec_field(capfd, tmp_path, spec, field):
    path = write(tmp_path / "c.yaml", spec)
    assert_one_line(capfd, ["simulate", "vgg19", "--tiny", "--cluster", path, "--baseline", "dp-nccl"], field, "must be")


@pytest.mark.parametrize("preset, field", [("local:2,bandwidth=1e-300", "bandwidth"), ("local:2,latency=1e300", "latency")])
def test_absurd_speeds_in_preset_arguments(capfd, preset, field):
    assert_one_line(capfd, ["show", "resnet101", "--cluster", preset], field, "must be in")


# ---------------------------------------------------------------------------- 11. silently accepted input
@pytest.mark.parametrize("name, text, words", [
    ("dup.yaml", SPEC + "machines:\n  - {gpu: t4}\n", ("'machines'", "twice")),
    ("dup.json", '{"machines": [], "machines": [{"gpu": "t4"}]}', ("'machines'", "twice")),
])
def test_duplicate_keys(capfd, tmp_path, name, text, words):
    assert_one_line(capfd, ["show", "resnet101", "--cluster", write(tmp_path / name, text)], name, *words)


@pytest.mark.parametrize("spec, words", [
    ("gpus:\n  RTX: {memory: 24GiB, memory_bandwidth: 936GB/s, fp32: 35TFLOPS}\n"
     "  rtx: {memory: 12GiB, memory_bandwidth: 500GB/s, fp32: 10TFLOPS}\n" + SPEC, ("gpus.rtx", "defined twice")),
    (SPEC + "links:\n  - {between: [0, 1], bandwidth: 1GB/s}\n  - {between: [1, 0], bandwidth: 2GB/s}\n",
     ("links[1].between", "already linked by links[0]")),
])
def test_names_and_links_given_twice(capfd, tmp_path, spec, words):
    assert_one_line(capfd, ["show", "resnet101", "--cluster", write(tmp_path / "c.yaml", spec)], *words)


@pytest.mark.parametrize("argv", [
    ["show", "resnet101", "--cluster", ""],
    ["plan", "vgg19", "--tiny", "--cluster", TOY, "--out", ""],
    ["simulate", "vgg19", "--tiny", "--cluster", TOY, "--baseline", "dp-nccl", "--trace", ""],
    ["plan", "vgg19", "--tiny", "--cluster", TOY, "--policy", ""],
])
def test_empty_names_are_not_a_flag_left_out(capfd, argv):
    assert_one_line(capfd, argv, "must not be empty")


# -------------------------------------------------------------------- 12-14. environment and process hygiene
def _double(values):
    return values * 2


def test_numba_without_a_writable_cache_compiles_each_run(monkeypatch):
    from tag import _compiled

    if not _compiled.COMPILED:
        pytest.skip("numba is off (TAG_NO_NUMBA)")
    monkeypatch.setattr("numba.core.caching.CacheImpl._locator_classes", [])  # as if no folder were writable
    assert _compiled.jit(_double)(3) == 6


def test_pipedream_field_tag_does_not_read(capfd, tmp_path):
    # PipeDream's partitioned files end node lines with ' -- stage_id=N' (read); any other trailing field is refused
    line = ("node1 -- Input0 -- forward_compute_time=0.1, backward_compute_time=0.1, activation_size=4.0, "
            "parameter_size=0.0 -- colour=0\n")
    assert_one_line(capfd, ["show", write(tmp_path / "p.graph.txt", line)], "p.graph.txt:1", "unknown field 'colour'")


def test_train_clears_writes_a_kill_cut_short(capfd, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for stale in (".checkpoint.pt.k1x2.tmp", ".policy.pt.9f3a.tmp", ".history.json.x7.tmp"):
        (run / stale).write_bytes(b"half")
    config = write(tmp_path / "c.toml", "tiny = true\n")
    assert_one_line(capfd, ["train", "--config", config, "--out", run, "--resume"], "no training checkpoint")
    assert list(run.iterdir()) == []


WORKER = """
import os, sys, time
from tag.training.selfplay import SelfPlayPool
pool = SelfPlayPool(1)
print(pool._pool.submit(os.getpid).result(), flush=True)
time.sleep(600)
"""


def test_selfplay_workers_die_with_a_killed_trainer():
    import signal
    import subprocess
    import sys
    import time

    trainer = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(trainer.stdout.readline())
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker, signal.SIGKILL)
    pytest.fail(f"self-play worker {worker} outlived its killed trainer")
