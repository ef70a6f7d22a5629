"""Model zoo: parameter counts against the papers, tiny train steps on CPU, meta builds, fake tracing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

from tag.errors import ModelError
from tag.models import MODELS, ModelSpec, get_model, list_models
from tag.models._table import count_parameters

DOCS = Path(__file__).resolve().parents[1] / "docs" / "models.md"

NAMES = list(MODELS)

# Standard parameter counts: the zoo must land within 1% of each.
REFERENCE_PARAMETERS = {
    "resnet101": 44.5e6,
    "resnet152": 60.2e6,
    "vgg19": 143.7e6,
    "inception-v3": 23.8e6,
    "bert-large": 335e6,
    "gpt2": 124e6,
}


def _num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _train_step(model, loss_fn):
    """A functional forward + loss + gradient step, the shape the graph tracer uses."""
    names = [name for name, _ in model.named_parameters()]

    def step(params, *inputs):
        loss = loss_fn(functional_call(model, params, inputs))
        return torch.autograd.grad(loss, [params[name] for name in names])

    return step


@pytest.mark.parametrize("name", sorted(REFERENCE_PARAMETERS))
def test_parameter_count_matches_reference(name):
    model, _, _ = get_model(name).build()
    assert _num_parameters(model) == pytest.approx(REFERENCE_PARAMETERS[name], rel=0.01)


def test_bert_large_body_is_standard_bert_model():
    """Embeddings + 24 layers + pooler, without the pre-training heads: the familiar 335M."""
    model, _, _ = get_model("bert-large").build()
    heads = ("mlm_", "nsp_")
    body = sum(p.numel() for name, p in model.named_parameters() if not name.startswith(heads))
    assert body == pytest.approx(335e6, rel=0.01)


@pytest.mark.parametrize("name", NAMES)
def test_full_model_builds_on_meta(name):
    spec = get_model(name)
    model, inputs, loss_fn = spec.build()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(x.device.type == "meta" and x.shape[0] == spec.batch_size for x in inputs)
    loss = loss_fn(model(*inputs))
    assert loss.shape == () and loss.device.type == "meta"


@pytest.mark.parametrize("name", NAMES)
def test_tiny_model_trains_on_cpu(name):
    torch.manual_seed(0)
    model, inputs, loss_fn = get_model(name).build(tiny=True, device="cpu")
    batch = inputs[0].shape[0]
    assert 2 <= batch <= 4 and all(x.shape[0] == batch for x in inputs)
    loss = loss_fn(model(*inputs))
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None, f"{name}: no gradient for {param_name}"
        assert torch.isfinite(param.grad).all(), f"{name}: non-finite gradient for {param_name}"


@pytest.mark.parametrize("name", NAMES)
def test_tiny_train_step_traces_with_fake_tensors(name):
    model, inputs, loss_fn = get_model(name).build(tiny=True, device="cpu")
    params = dict(model.named_parameters())
    graph = make_fx(_train_step(model, loss_fn), tracing_mode="fake")(params, *inputs)
    outputs = [node for node in graph.graph.nodes if node.op == "output"]
    assert len(outputs) == 1


@pytest.mark.parametrize("name", ["bert-large", "dlrm"])
def test_full_train_step_traces_on_meta(name):
    model, inputs, loss_fn = get_model(name).build()
    graph = make_fx(_train_step(model, loss_fn), tracing_mode="fake")(dict(model.named_parameters()), *inputs)
    assert any(node.op == "call_function" for node in graph.graph.nodes)


def test_batch_size_override():
    model, inputs, loss_fn = get_model("dlrm").build(tiny=True, batch_size=3, device="cpu")
    assert all(x.shape[0] == 3 for x in inputs)
    assert loss_fn(model(*inputs)).shape == ()


def test_example_inputs_repeat():
    _, first, _ = get_model("bert-small").build(tiny=True, device="cpu")
    _, second, _ = get_model("bert-small").build(tiny=True, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("batch_size", [0, -2, 1.5, True])
def test_bad_batch_size_raises(batch_size):
    with pytest.raises(ModelError, match="batch_size"):
        get_model("resnet101").build(batch_size=batch_size)


def test_bad_device_raises():
    with pytest.raises(ModelError, match="device"):
        get_model("gpt2").build(tiny=True, device="no-such-device")


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ModelError, match="nope") as info:
        get_model("nope")
    assert all(name in str(info.value) for name in NAMES)


def test_lookup_ignores_case_and_underscores():
    assert get_model("Inception_V3") is MODELS["inception-v3"]


def test_registry_is_consistent():
    specs = list_models()
    assert [spec.name for spec in specs] == NAMES
    assert len(NAMES) == 13
    for spec in specs:
        assert isinstance(spec, ModelSpec) and spec.batch_size > 0 and spec.description and spec.paper_source


def test_docs_table_counts_are_computed_ones():
    """docs/models.md lists every model with the parameter count the code gives today."""
    rows = [line.split(" | ") for line in DOCS.read_text().splitlines() if line.startswith("| `")]
    documented = {cells[0].strip("| `"): int(cells[4].replace(",", "")) for cells in rows}
    assert documented == {name: count_parameters(spec) for name, spec in MODELS.items()}
