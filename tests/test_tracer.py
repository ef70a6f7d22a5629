"""Tracer: a PyTorch model → the OpGraph of forward + backward + Adam at aten level."""

from __future__ import annotations

import json
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from tag.errors import ModelError, SpecError
from tag.graph import ROLES, SPLIT_CLASSES, load_graph, save_graph
from tag.graph.flops import FALLBACK_RULES, op_flops
from tag.graph.tracer import _train_step, load_user_function, trace, trace_zoo

REGISTRY_PACKETS = {str(packet) for packet in flop_registry}  # "aten.mm", "aten.convolution", ...


# ---------------------------------------------------------------------------------------- tiny models
class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)  # tracks running statistics: mutated in train mode
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        h = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


class AttentionBlock(nn.Module):
    """Embeddings, pre-norm causal self-attention (SDPA), dropout, MLP and an LM head."""

    def __init__(self, vocab: int = 40, dim: int = 16, heads: int = 2, seq: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        batch, seq = ids.shape
        positions = torch.arange(seq, device=ids.device).expand(batch, seq)
        x = self.tokens(ids) + self.positions(positions)
        q, k, v = self.qkv(self.norm1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dropout(self.proj(attention.transpose(1, 2).reshape(batch, seq, -1)))
        return self.head(x + self.mlp(self.norm2(x)))


def class_loss(logits):
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


def token_loss(logits):
    flat = logits.flatten(0, -2)
    return F.cross_entropy(flat, torch.zeros(flat.shape[0], dtype=torch.long, device=flat.device))


def build_local(name: str, device: str = "cpu"):
    """(model, inputs, loss_fn) of a tiny model defined here, seeded."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    with torch.device(device):
        if name == "mlp":
            model, shape, loss = MLP(), (4, 12), class_loss
        elif name == "cnn":
            model, shape, loss = SmallCNN(), (4, 3, 8, 8), class_loss
        else:
            model, shape, loss = AttentionBlock(), None, token_loss
    if shape is None:
        inputs = (torch.randint(0, 40, (4, 8), generator=generator).to(device),)
    else:
        inputs = (torch.randn(shape, generator=generator).to(device),)
    return model, inputs, loss


LOCAL_MODELS = ("mlp", "cnn", "attention")
_CACHE: dict = {}


def traced(name: str):
    """The traced graph of a local tiny model, traced once per session."""
    if name not in _CACHE:
        model, inputs, loss = build_local(name)
        _CACHE[name] = trace(model, inputs, loss, name=name)
    return _CACHE[name]


def zoo_names() -> list[str]:
    try:
        from tag.models import MODELS
    except ImportError:
        return []
    return list(MODELS)


# ---------------------------------------------------------------------------------------- helpers
def root(ref):
    """The op a JSON reference reads, looking through folded view expressions."""
    while "expr" in ref:
        ref = next(a for a in ref["expr"]["args"] if isinstance(a, dict) and ("ref" in a or "expr" in a))
    return ref["ref"]


def op_class(graph, i):
    return SPLIT_CLASSES[graph.split[i]]


def registry_flops(graph) -> float:
    return float(sum(f for f, kind in zip(graph.flops, graph.kinds) if kind.rsplit(".", 1)[0] in REGISTRY_PACKETS))


def flop_counter_total(model, inputs, loss) -> int:
    step, flat = _train_step(model, inputs, loss)
    with FlopCounterMode(display=False) as counter:
        step(*flat)
    return counter.get_total_flops()


def _decode(value, values):
    if isinstance(value, list):
        return [_decode(v, values) for v in value]
    if isinstance(value, dict):
        if "ref" in value:
            result = values[value["ref"]]
            return result[value["out"]] if isinstance(result, (tuple, list)) else result
        if "expr" in value:
            return _call(value["expr"], values)
        if "dtype" in value or "layout" in value or "memory_format" in value:
            return getattr(torch, next(iter(value.values())).split(".")[-1])
        if "device" in value:
            return torch.device(value["device"])
        if "float" in value:
            return float(value["float"])
        return {k: _decode(v, values) for k, v in value.items()}
    return value


def _call(record, values):
    args = _decode(record["args"], values)
    kwargs = {k: _decode(v, values) for k, v in record["kwargs"].items()}
    if record["target"] == "getitem":
        return args[0]
    namespace, name, overload = record["target"].split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)(*args, **kwargs)


def execute(graph, tensors: dict[str, torch.Tensor]) -> list:
    """Run the graph's argument records on real tensors, as an executor would: values[op]."""
    values: list = [None] * graph.num_ops
    for i in graph.topological_order():
        record = graph.args[i]
        values[i] = tensors[record["name"]] if record["target"] == "placeholder" else _call(record, values)
    return values


# ---------------------------------------------------------------------------------------- FLOPs
@pytest.mark.parametrize("name", LOCAL_MODELS)
def test_flops_match_flop_counter_on_local_models(name):
    graph = traced(name)
    model, inputs, loss = build_local(name)
    assert registry_flops(graph) == flop_counter_total(model, inputs, loss) > 0
    assert graph.meta["flops_registry"] == registry_flops(graph)
    assert graph.flops.sum() == pytest.approx(graph.meta["flops_registry"] + graph.meta["flops_fallback"])


@pytest.mark.parametrize("name", zoo_names())
def test_flops_match_flop_counter_on_zoo_tiny_models(name):
    from tag.models import get_model

    torch.manual_seed(0)
    model, inputs, loss = get_model(name).build(tiny=True, device="cpu")
    graph = trace(model, inputs, loss, name=name)
    assert registry_flops(graph) == flop_counter_total(model, inputs, loss) > 0
    assert graph.is_dag()
    counts = graph.count_by_role()
    assert all(counts[role] > 0 for role in ROLES), counts
    assert graph.meta["parameters"] == sum(p.numel() for p in model.parameters())


def test_fallback_flops_table():
    x = torch.empty(4, 6)
    assert op_flops(torch.ops.aten.relu.default, (x,), {}, x) == (24.0, "fallback:elementwise")
    assert op_flops(torch.ops.aten.sum.default, (x,), {}, torch.empty(())) == (24.0, "fallback:reduction")
    assert op_flops(torch.ops.aten.view.default, (x, [24]), {}, x.view(24)) == (0.0, "fallback:free")
    assert op_flops(torch.ops.aten._softmax.default, (x, 1, False), {}, x)[1] == "fallback:normalisation"
    assert op_flops(torch.ops.aten.mm.default, (x, torch.empty(6, 3)), {}, torch.empty(4, 3)) == (144.0, "registry")
    assert set(FALLBACK_RULES) == {"attention", "free", "normalisation", "reduction", "elementwise"}


# ---------------------------------------------------------------------------------------- roles
@pytest.mark.parametrize("name", LOCAL_MODELS)
def test_roles(name):
    graph = traced(name)
    outputs = graph.meta["outputs"]
    role = lambda ref: ROLES[graph.role[root(ref)]]  # noqa: E731
    assert role(outputs["loss"]) == "forward"
    assert {role(ref) for ref in outputs["grads"].values()} == {"backward"}
    assert {role(ref) for group in ("params", "exp_avg", "exp_avg_sq") for ref in outputs[group].values()} == {"optimizer"}
    counts = graph.count_by_role()
    assert all(counts[r] > 0 for r in ROLES), counts
    kinds = {graph.kinds[i] for i in range(graph.num_ops) if graph.role[i] == 0}
    assert {"parameter", "optimizer_state", "input"} <= kinds
    params = [i for i, kind in enumerate(graph.kinds) if kind == "parameter"]
    assert graph.param_bytes.sum() == graph.param_bytes[params].sum() == 4 * graph.meta["parameters"]


def test_meta_records_the_model():
    graph = traced("cnn")
    model, _, _ = build_local("cnn")
    meta = graph.meta
    assert meta["model"] == "cnn" and meta["batch_size"] == graph.batch_size == 4
    assert meta["parameters"] == sum(p.numel() for p in model.parameters())
    assert meta["param_dtype_bytes"] == 4 and meta["source"] == "torch"
    assert meta["torch_version"] == torch.__version__


# ---------------------------------------------------------------------------------------- split classes
def test_split_classes_cnn_batch_norm_keeps_local_statistics():
    graph = traced("cnn")
    kinds = graph.kinds
    bn = kinds.index("aten._native_batch_norm_legit_functional.default")
    assert op_class(graph, bn) == "concat" and graph.batch_scaled[bn]
    outputs = {graph.args[i]["args"][0]["out"]: i for i in graph.successors(bn) if kinds[i] == "getitem"}
    assert op_class(graph, outputs[0]) == "concat"  # normalised activations
    for k in (1, 2, 3, 4):  # saved mean / invstd, new running mean / var
        assert op_class(graph, outputs[k]) == "none" and not graph.batch_scaled[outputs[k]]
    buffers = graph.meta["outputs"]["buffers"]
    assert root(buffers["bn.running_mean"]) == outputs[3] and root(buffers["bn.running_var"]) == outputs[4]
    for kind in ("aten.convolution.default", "aten.relu.default", "aten.addmm.default", "aten.max_pool2d_with_indices.default"):
        assert op_class(graph, kinds.index(kind)) == "concat", kind


@pytest.mark.parametrize("name", LOCAL_MODELS)
def test_split_classes_activations_gradients_updates(name):
    graph = traced(name)
    outputs = graph.meta["outputs"]
    for param, ref in outputs["grads"].items():
        assert op_class(graph, root(ref)) == "sum", param  # weight gradients are partial sums
    for group in ("params", "exp_avg", "exp_avg_sq"):
        for ref in outputs[group].values():
            i = root(ref)
            assert op_class(graph, i) == "none" and not graph.batch_scaled[i]
    # the first optimizer op of each parameter consumes the summed gradient
    grad_ops = {root(ref) for ref in outputs["grads"].values()}
    consumers = {int(c) for g in grad_ops for c in graph.successors(g) if ROLES[graph.role[c]] == "optimizer"}
    assert consumers and all(op_class(graph, c) == "none" for c in consumers)
    assert op_class(graph, root(outputs["loss"])) == "sum"
    forward = [i for i in range(graph.num_ops) if ROLES[graph.role[i]] == "forward" and graph.kinds[i].startswith("aten.")]
    compute = [i for i in forward if graph.kinds[i].split(".")[1] in ("addmm", "convolution", "relu", "gelu", "_log_softmax")]
    assert compute and all(op_class(graph, i) == "concat" and graph.batch_scaled[i] for i in compute)
    data = [i for i, kind in enumerate(graph.kinds) if kind == "input"]
    assert all(op_class(graph, i) == "concat" for i in data)


def test_attention_block_stays_data_parallel():
    graph = traced("attention")
    gathered = [graph.kinds[i] for i in range(graph.num_ops)
                if ROLES[graph.role[i]] in ("forward", "backward") and op_class(graph, i) == "none" and graph.batch_scaled[i]]
    assert gathered == []
    sdpa = graph.kinds.index("aten._scaled_dot_product_flash_attention_for_cpu.default")
    assert op_class(graph, sdpa) == "concat"
    # the position ids are broadcast over the batch: their lookup runs on each replica's slice
    lookups = [i for i, kind in enumerate(graph.kinds) if kind == "aten.embedding.default"]
    assert len(lookups) == 2 and all(op_class(graph, i) == "concat" for i in lookups)


def test_weight_gradient_edges_do_not_grow_with_the_batch():
    graph = traced("mlp")
    grads = {root(ref) for ref in graph.meta["outputs"]["grads"].values()}
    for g in grads:
        for e in graph.succ_edge[graph.succ_ptr[g] : graph.succ_ptr[g + 1]]:
            assert not graph.edge_batch_scaled[e]
    relu = graph.kinds.index("aten.relu.default")
    assert all(graph.edge_batch_scaled[e] for e in graph.succ_edge[graph.succ_ptr[relu] : graph.succ_ptr[relu + 1]])


def test_sum_loss_gradient_seed_is_data_parallel(user_file):
    model, inputs, loss = load_user_function(f"{user_file}:good")  # loss = out.sum(): seed expanded over the batch
    graph = trace(model, inputs, loss)
    grads = graph.meta["outputs"]["grads"]
    assert {op_class(graph, root(ref)) for ref in grads.values()} == {"sum"}
    seeds = [i for i in range(graph.num_ops) if ROLES[graph.role[i]] == "backward" and op_class(graph, i) == "none"]
    assert [graph.kinds[i] for i in seeds] == ["aten.ones_like.default"]  # the scalar seed only


def test_in_place_ops_and_a_mean_loss_stay_data_parallel():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act, self.bn = nn.Linear(8, 8), nn.ReLU(inplace=True), nn.BatchNorm1d(8)

        def forward(self, x):
            h = self.act(self.fc(x)) * 2
            h += x
            return self.bn(h).sum(1)

    graph = trace(Residual(), (torch.randn(4, 8),), lambda out: out.mean())
    assert not any("_." in kind for kind in graph.kinds if kind.startswith("aten."))  # no in-place op left
    gathered = [graph.kinds[i] for i in range(graph.num_ops)
                if ROLES[graph.role[i]] in ("forward", "backward") and op_class(graph, i) == "none" and graph.batch_scaled[i]]
    assert gathered == []
    backward = graph.kinds.index("aten.native_batch_norm_backward.default")
    assert op_class(graph, backward) == "concat"


def test_batch_of_one_is_analysed_at_batch_two():
    model, inputs, loss = build_local("attention")
    graph = trace(model, (inputs[0][:1],), loss)
    assert graph.batch_size == 1
    reference = traced("attention")
    assert graph.kinds == reference.kinds
    np.testing.assert_array_equal(graph.split, reference.split)
    np.testing.assert_array_equal(graph.batch_scaled, reference.batch_scaled)


def test_split_classes_can_be_skipped():
    model, inputs, loss = build_local("mlp")
    graph = trace(model, inputs, loss, split_classes=False)
    assert set(graph.split.tolist()) == {SPLIT_CLASSES.index("none")}
    assert graph.batch_scaled[graph.kinds.index("aten.relu.default")]
    assert graph.num_ops == traced("mlp").num_ops


# ---------------------------------------------------------------------------------------- structure
@pytest.mark.parametrize("name", LOCAL_MODELS)
def test_graph_is_a_dag_and_round_trips(tmp_path, name):
    graph = traced(name)
    graph.validate()
    assert graph.is_dag()
    path = tmp_path / f"{name}.json.gz"
    save_graph(graph, path)
    back = load_graph(path)
    assert back.names == graph.names and back.kinds == graph.kinds and back.args == graph.args
    for column in ("role", "split", "batch_scaled", "flops", "bytes_accessed", "output_bytes", "param_bytes",
                   "edge_src", "edge_dst", "edge_bytes", "edge_batch_scaled"):
        np.testing.assert_array_equal(getattr(back, column), getattr(graph, column))
    assert back.meta == json.loads(json.dumps(graph.meta))


def test_references_point_backwards_and_views_are_folded():
    graph = traced("attention")
    order = {int(op): k for k, op in enumerate(graph.topological_order())}
    edges = set(zip(graph.edge_src.tolist(), graph.edge_dst.tolist()))

    def refs(value):
        if isinstance(value, list):
            for v in value:
                yield from refs(v)
        elif isinstance(value, dict):
            if "ref" in value:
                yield value["ref"]
            for v in value.values():
                yield from refs(v)

    for i, record in enumerate(graph.args):
        for r in refs(record):
            assert order[r] < order[i] and (r, i) in edges
    folded_kinds = {"aten.view.default", "aten.t.default", "aten.detach.default", "aten.transpose.int", "aten.expand.default"}
    assert not folded_kinds & set(graph.kinds)
    assert graph.meta["folded_views"] > 0


def test_edge_bytes():
    graph = traced("mlp")
    fc1_weight = graph.names.index("parameter:fc1.weight")
    addmm = graph.kinds.index("aten.addmm.default")  # reads fc1.weight through a folded t()
    edge = next(e for e in range(graph.num_edges) if graph.edge_src[e] == fc1_weight and graph.edge_dst[e] == addmm)
    assert graph.edge_bytes[edge] == 12 * 16 * 4
    relu = graph.kinds.index("aten.relu.default")
    for e in graph.succ_edge[graph.succ_ptr[relu] : graph.succ_ptr[relu + 1]]:
        assert graph.edge_bytes[e] == graph.output_bytes[relu] == 4 * 16 * 4


def test_unfolded_graph_has_the_same_cost():
    model, inputs, loss = build_local("cnn")
    unfolded = trace(model, inputs, loss, fold_views=False)
    folded = traced("cnn")
    assert unfolded.num_ops > folded.num_ops
    assert unfolded.flops.sum() == folded.flops.sum()
    assert unfolded.is_dag() and "aten.t.default" in unfolded.kinds


@pytest.mark.parametrize("name", ("mlp", "cnn"))
def test_argument_records_execute_to_the_train_step(name):
    model, inputs, loss = build_local(name)
    graph = traced(name)
    step, flat = _train_step(model, inputs, loss)
    expected = step(*flat)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    tensors = {"input:0": inputs[0]}
    for key, p in params.items():
        tensors[f"parameter:{key}"] = p.detach()
        tensors[f"exp_avg:{key}"] = torch.zeros_like(p)
        tensors[f"exp_avg_sq:{key}"] = torch.zeros_like(p)
    tensors.update({f"buffer:{key}": b.clone() for key, b in buffers.items()})
    values = execute(graph, tensors)
    outputs = graph.meta["outputs"]
    assert torch.allclose(_decode(outputs["loss"], values), expected[0])
    n = len(params)
    for k, key in enumerate(params):
        assert torch.allclose(_decode(outputs["grads"][key], values), expected[1 + k], atol=1e-6)
        assert torch.allclose(_decode(outputs["params"][key], values), expected[1 + n + k], atol=1e-6)
    new_buffers = expected[len(expected) - len(buffers):]
    for key, reference in zip(buffers, new_buffers):
        assert torch.allclose(_decode(outputs["buffers"][key], values).to(reference.dtype), reference)


# ---------------------------------------------------------------------------------------- devices, options
def test_meta_model_traces_like_cpu_model():
    model, inputs, loss = build_local("cnn", device="meta")
    graph = trace(model, inputs, loss, name="cnn")
    reference = traced("cnn")
    assert graph.kinds == reference.kinds
    np.testing.assert_array_equal(graph.flops, reference.flops)
    np.testing.assert_array_equal(graph.split, reference.split)


def test_sgd_and_progress():
    model, inputs, loss = build_local("mlp")
    calls = []
    graph = trace(model, inputs, loss, optimizer="sgd", progress=lambda phase, done, total: calls.append(phase))
    assert {"build", "make_fx", "analysis", "flops"} <= set(calls)
    assert graph.count_by_role()["optimizer"] == 4  # one add per parameter
    assert "exp_avg" not in " ".join(graph.names)


def test_unused_parameter_keeps_its_value():
    class Partly(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.used(x)

    graph = trace(Partly(), (torch.randn(2, 3),), class_loss)
    outputs = graph.meta["outputs"]
    assert outputs["grads"]["unused.weight"] is None
    assert graph.names[root(outputs["params"]["unused.weight"])] == "parameter:unused.weight"


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (("not a model", (torch.randn(2, 3),), class_loss), ModelError, "torch.nn.Module"),
        ((MLP(), (torch.tensor(1.0),), class_loss), ModelError, "batch dimension"),
        ((MLP(), (torch.randn(2, 12),), lambda out: out), ModelError, "scalar"),
        ((MLP(), (torch.randn(2, 3),), class_loss), ModelError, "cannot trace"),
    ],
)
def test_trace_errors(arguments, error, message):
    with pytest.raises(error, match=message) as info:
        trace(*arguments)
    assert "\n" not in str(info.value)


def test_unknown_optimizer():
    with pytest.raises(SpecError, match="optimizer"):
        trace(MLP(), (torch.randn(2, 12),), class_loss, optimizer="lion")


@pytest.mark.skipif(not zoo_names(), reason="model zoo not available")
def test_trace_zoo_tiny_on_meta():
    graph = trace_zoo("bert-small", tiny=True, batch_size=2)
    assert graph.batch_size == 2 and graph.meta["model"] == "bert-small-tiny"
    assert graph.is_dag()


@pytest.mark.skipif(not zoo_names(), reason="model zoo not available")
def test_bert_large_traces_on_meta():
    start = time.perf_counter()
    graph = trace_zoo("bert-large")
    seconds = time.perf_counter() - start
    print(f"bert-large: {graph.num_ops} ops, {graph.num_edges} edges, traced in {seconds:.1f} s")
    assert graph.meta["parameters"] > 330e6 and graph.batch_size == 16
    assert registry_flops(graph) == graph.meta["flops_registry"] > 1e13
    assert seconds < 60


# ---------------------------------------------------------------------------------------- user functions
USER_FILE = """
import torch
from torch import nn

def good():
    return nn.Linear(3, 2), (torch.randn(4, 3),), lambda out: out.sum()

def wrong():
    return nn.Linear(3, 2)

def broken():
    raise RuntimeError("no weights here")

not_a_function = 3
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "user_models.py"
    path.write_text(textwrap.dedent(USER_FILE))
    return path


def test_load_user_function_from_file_and_module(user_file, monkeypatch):
    model, inputs, loss = load_user_function(f"{user_file}:good")
    assert isinstance(model, nn.Linear) and inputs[0].shape == (4, 3)
    graph = trace(model, inputs, loss)
    assert graph.is_dag() and graph.batch_size == 4
    monkeypatch.syspath_prepend(str(user_file.parent))
    model, inputs, loss = load_user_function("user_models:good")
    assert isinstance(model, nn.Linear)


@pytest.mark.parametrize(
    "spec, error, message",
    [
        ("no_such_package_xyz.models:build", SpecError, "no module named"),
        ("{dir}/missing.py:good", SpecError, "no such Python file"),
        ("{file}:absent", SpecError, "has no function 'absent'"),
        ("{file}:not_a_function", SpecError, "not a function"),
        ("{file}:wrong", ModelError, "must return"),
        ("{file}:broken", ModelError, "no weights here"),
        ("just_a_name", SpecError, "MODULE:FUNCTION"),
    ],
)
def test_load_user_function_errors(user_file, spec, error, message):
    spec = spec.format(file=user_file, dir=user_file.parent)
    with pytest.raises(error, match=message) as info:
        load_user_function(spec)
    assert "\n" not in str(info.value)
