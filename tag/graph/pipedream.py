"""Import a PipeDream profile (``graph.txt``) as an OpGraph of forward, backward and optimizer ops.

The PipeDream profiler (msr-fiddle/pipedream) writes one line per layer, then the edges::

    nodeN -- LayerRepr(...) -- forward_compute_time=MS, backward_compute_time=MS, activation_size=BYTES, parameter_size=BYTES
    \tnodeA -- nodeB

PipeDream's optimizer writes the same file with `` -- stage_id=N`` appended to every node line (a
*partitioned* file). The loaders here read it as the same profile; :func:`pipedream_stages` returns the
layer → stage map, checked (every node staged, ids 0..S-1 all used, never decreasing along an edge),
which ``tag simulate PARTITIONED.txt`` scores as a pipeline plan.

Times are milliseconds for one mini-batch; ``activation_size`` is the layer's output for the whole batch
(a ``[a; b; c]`` list for layers with several outputs, e.g. an LSTM's output, h and c); parameter sizes
are bytes. Every layer becomes:

- a **forward** op (``nodeN.forward``, kind = the layer's class name) carrying the measured forward
  time, the layer's parameters (``param_bytes``; the layer owns its weights) and its activation as
  output; split class ``concat``;
- a **backward** op (``nodeN.backward``) carrying the measured backward time. Edges are mirrored: for a
  forward edge u → v the gradient flows backward(v) → backward(u) with the bytes of u's activation;
  forward(v) → backward(v) carries v's activation, saved for the backward pass;
- an **optimizer** op (``nodeN.optimizer``, kind ``Adam``) for every layer with parameters, fed by
  backward(v) → optimizer(v) with the parameter bytes (the weight gradient). No measured time.

Model inputs (``Input``, ``Input0``…, GNMT's ``hidden``: any layer with no predecessor and no parameters)
become one op of role ``input`` and have no backward op. Their measured "forward" time (VGG's data
loading, 18 ms) is not an op cost; it is kept in ``meta["input_load_time"]``.

**Split classes** (TAG §4.1.1): forward and input ops ``concat``; optimizer ops ``none`` (they need the
summed gradient); a backward op is ``sum`` when its layer has parameters (the weight gradient of a
batch slice is a partial sum) and ``concat`` otherwise. A backward op of a layer with parameters also
yields the activation gradient, which is really ``concat``: one split class per op cannot say both, and
``sum`` is the one whose mistake costs correctness (an un-summed weight gradient), so it wins.

**Cost estimates** (FLOPs and bytes at the profiled batch, fp32) come from the layer repr and the
activation sizes; they feed the roofline on GPUs other than the measured one:

- Conv2d: 2 · out_elements · in_channels/groups · kh · kw (+ out_elements for the bias);
- Linear: 2 · out_elements · in_features (+ bias);
- LSTM / GRU: 2 · gates · tokens · hidden · (input + hidden) per direction and layer, gates = 4 / 3,
  i.e. 8 · tokens · H · (I + H) per LSTM direction/layer, plus ~10 FLOPs per gate output for the
  cell's element-wise work; tokens = output elements / (hidden · directions);
- Embedding: a lookup, 1 FLOP per output element; bytes = output read + written;
- BatchNorm, ReLU, Dropout, pooling, Add, Concat, Softmax…: a few FLOPs per element (table
  ``_ELEMENTWISE``), bytes = inputs + outputs. PipeDream times modules only and reads 0 ms for the
  functional Add and Concat; they still move memory, so they keep their estimate;
- views (View, Size, __getitem__, Flatten): zero cost, no kernel;
- a composite module (``Classifier((classifier): Linear(...))``, GNMT's ``RecurrentAttention``) sums
  its Linear / LSTM / GRU / Conv2d / Embedding leaves, sized by the composite's first output; a leaf
  whose parameters would push the sum past the layer's measured ``parameter_size`` is taken to be a
  weight-tied alternative and skipped (GNMT's ``EmuBidirLSTM`` holds ``bidir`` and two
  weight-sharing single-direction copies; only ``bidir`` runs);
- an unknown layer kind: bytes only (input + output + parameters), with a warning.

Bytes accessed by a forward op = its inputs (the activations of its predecessors) + its outputs + its
parameters, with an extra read of the input for normalisation layers. Backward of a layer with
parameters: 2× the forward FLOPs and bytes (a data gradient and a weight gradient, each about one
forward); of a parameter-free layer: 1× the FLOPs and 1.5× the bytes (reads the output gradient and the
saved tensor, writes the input gradient). Embedding backward writes a dense weight gradient (PyTorch's
default): 2 × parameter bytes + the output gradient. Adam: 10 FLOPs per parameter element and
7 × parameter bytes (reads parameter, gradient, m, v; writes parameter, m, v — a fused update).

**Batch size** of the profile (``batch_size`` overrides), first rule that gives a whole number:

1. an LSTM/GRU layer whose activation lists its state: batch = bytes of h / (4 · hidden · layers ·
   directions) (GNMT: 131072 / (4 · 1024) = 32);
2. the network's last Linear layer (a sink): batch = activation / (4 · out_features) (VGG16 and
   ResNet-50: 512000 / 4000 = 128);
3. an ``Input`` of whole 3×224×224 fp32 images: activation / 602112;
4. otherwise 1, with a warning and ``meta["batch_size_inferred"] = False``.

**Measured on**: the profiles carry no device name. ``measured_on`` defaults to ``"v100-16gb"``: VGG16's
first in-place ReLU moves 2 × 1.64 GB in 4.45 ms, 740 GB/s, more than any Pascal card's peak memory
bandwidth (1080 Ti 484, Titan X 480 GB/s), which leaves the V100 (900 GB/s) of the PipeDream paper's
clusters; its first 3×3 conv then runs at 65 % of the V100's fp32 peak, a usual cuDNN figure.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

from tag._read import read_input
from tag.errors import ProfileError
from tag.graph.opgraph import (
    ROLE_BACKWARD,
    ROLE_FORWARD,
    ROLE_INPUT,
    ROLE_OPTIMIZER,
    SPLIT_CONCAT,
    SPLIT_NONE,
    SPLIT_SUM,
    OpGraph,
)

__all__ = ["load_pipedream", "parse_pipedream", "pipedream_stages", "PipeDreamLayer", "DEFAULT_MEASURED_ON"]

log = logging.getLogger(__name__)

DEFAULT_MEASURED_ON = "v100-16gb"  # see the module docstring for the evidence
_DTYPE_BYTES = 4  # PipeDream profiles fp32 training
_IMAGE_BYTES = 3 * 224 * 224 * _DTYPE_BYTES
_STAT_KEYS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_ADAM_FLOPS_PER_PARAMETER = 10.0
_ADAM_BYTES_PER_PARAM_BYTE = 7.0  # read p, g, m, v; write p, m, v
_SEPARATOR = " -- "

# Layers that only reshape, index or report a size: PipeDream measures them at 0 ms.
_ZERO_COST = frozenset({"View", "Size", "__getitem__", "Flatten", "Reshape", "Squeeze", "Unsqueeze",
                        "Transpose", "Permute", "Identity"})
# Element-wise and normalisation layers: (FLOPs per output element, extra reads of the input).
_ELEMENTWISE: dict[str, tuple[float, float]] = {
    "ReLU": (1.0, 0.0), "ReLU6": (1.0, 0.0), "LeakyReLU": (2.0, 0.0), "ELU": (4.0, 0.0),
    "Sigmoid": (4.0, 0.0), "Tanh": (4.0, 0.0), "GELU": (8.0, 0.0), "Hardtanh": (2.0, 0.0),
    "Dropout": (4.0, 0.0), "Dropout2d": (4.0, 0.0),
    "BatchNorm1d": (8.0, 1.0), "BatchNorm2d": (8.0, 1.0), "BatchNorm3d": (8.0, 1.0),
    "LayerNorm": (8.0, 1.0), "GroupNorm": (8.0, 1.0),
    "Add": (1.0, 0.0), "Mul": (1.0, 0.0), "Sub": (1.0, 0.0), "Div": (1.0, 0.0), "Concat": (0.0, 0.0), "Cat": (0.0, 0.0),
    "Softmax": (5.0, 1.0), "LogSoftmax": (5.0, 1.0),
}
_POOLING = frozenset({"MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
                      "AdaptiveAvgPool2d", "AdaptiveMaxPool2d"})
_LEAVES = ("LSTM", "GRU", "Linear", "Conv2d", "Embedding")
_LEAF_PATTERN = re.compile(r"\b(LSTM|GRU|Linear|Conv2d|Embedding)\(")
_INPUT_KIND = re.compile(r"^Input\d*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][\w.\-]*$")
_STAGE_FIELD = re.compile(r"^stage_id=(\S*)$")  # the optimizer's partitioned files end node lines with it
_STAGE_NUMBER = re.compile(r"[0-9]+")
_STAGE_DIGITS = 18  # longer ids are refused at parse time; pipedream_stages bounds the rest by the line count


class PipeDreamLayer(NamedTuple):
    """One node line of a profile. Times in seconds, sizes in bytes."""

    node: str
    module: str  # the layer's repr as profiled
    kind: str
    forward_time: float
    backward_time: float
    activation: tuple[float, ...]  # one entry per output
    param_bytes: float
    line: int
    stage: int | None = None  # PipeDream's `` -- stage_id=N`` (a partitioned file), else None

    @property
    def activation_bytes(self) -> float:
        return float(sum(self.activation))


class _Estimate(NamedTuple):
    flops: float
    bytes: float
    known: bool


# ------------------------------------------------------------------------------------------------ parsing


def parse_pipedream(path: str | Path) -> tuple[list[PipeDreamLayer], list[tuple[str, str, int]]]:
    """The layers and edges ``(src, dst, line)`` of a graph.txt; ProfileError "FILE:LINE: ..." if malformed.

    Edges are deduplicated; an edge to an undefined node, a node defined twice, a bad number and a
    cycle are errors.
    """
    path = Path(path)
    raw = read_input(path, what="PipeDream profile", error=ProfileError,
                     missing=f"{path}: cannot read PipeDream profile: no such file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: not a text file") from None
    layers: list[PipeDreamLayer] = []
    defined: dict[str, int] = {}
    edges: list[tuple[str, str, int]] = []
    seen_edges: set[tuple[str, str]] = set()
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        parts = raw.strip().split(_SEPARATOR)
        if raw[0].isspace():  # edges are indented, node lines are not
            if len(parts) != 2 or not all(_IDENTIFIER.match(p.strip()) for p in parts):
                raise ProfileError(f"{path}:{number}: cannot parse edge line {_clip(raw)!r} (expected '\\tnodeA -- nodeB')")
            edge = (parts[0].strip(), parts[1].strip())
            if edge not in seen_edges:
                seen_edges.add(edge)
                edges.append((*edge, number))
            continue
        layer = _parse_node_line(raw, number, path)
        if layer.node in defined:
            raise ProfileError(f"{path}:{number}: node {layer.node!r} is defined twice (first on line {defined[layer.node]})")
        defined[layer.node] = number
        layers.append(layer)
    if not layers:
        where = len(lines) if lines else 1
        raise ProfileError(f"{path}:{where}: empty PipeDream profile (no node lines)")
    for src, dst, number in edges:
        for end in (src, dst):
            if end not in defined:
                raise ProfileError(f"{path}:{number}: edge {src} -- {dst} names node {end!r}, which no node line defines")
    _check_acyclic(path, [layer.node for layer in layers], edges)
    return layers, edges


def _parse_node_line(raw: str, number: int, path: Path) -> PipeDreamLayer:
    text = raw.strip()
    stage = None
    tail = text.rfind(_SEPARATOR)
    found = _STAGE_FIELD.match(text[tail + len(_SEPARATOR):].strip()) if tail >= 0 else None
    if found:
        digits = found.group(1)
        if not _STAGE_NUMBER.fullmatch(digits):  # ASCII only: str.isdigit() also takes '²' and '٣'
            raise ProfileError(f"{path}:{number}: stage_id: cannot parse {_clip(digits, 40)!r} as a stage number")
        if len(digits.lstrip("0")) > _STAGE_DIGITS:  # int() of thousands of digits is slow, then refused
            raise ProfileError(f"{path}:{number}: stage_id {_clip(digits, 40)} is out of range "
                               "(a stage number is below the number of node lines)")
        stage, text = int(digits), text[:tail]
    first = text.find(_SEPARATOR)
    last = text.rfind(_SEPARATOR)
    if first < 0 or last == first:
        raise ProfileError(f"{path}:{number}: cannot parse node line {_clip(raw)!r} "
                           "(expected 'nodeN -- Layer(...) -- forward_compute_time=..., ...')")
    node, layer_repr, stats_text = text[:first].strip(), text[first + len(_SEPARATOR): last].strip(), text[last + len(_SEPARATOR):]
    if not _IDENTIFIER.match(node) or not layer_repr:
        raise ProfileError(f"{path}:{number}: cannot parse node line {_clip(raw)!r} (bad node name or empty layer)")
    stats: dict[str, str] = {}
    for item in stats_text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ProfileError(f"{path}:{number}: cannot parse node line {_clip(raw)!r}: {item.strip()!r} is not key=value")
        stats[key.strip()] = value.strip()
    unknown = [k for k in stats if k not in _STAT_KEYS]
    if unknown:
        raise ProfileError(f"{path}:{number}: node {node}: unknown field {unknown[0]!r} "
                           f"(tag reads {', '.join(_STAT_KEYS)})")
    missing = [k for k in _STAT_KEYS if k not in stats]
    if missing:
        raise ProfileError(f"{path}:{number}: node {node}: missing {', '.join(missing)}")
    forward_ms = _number(stats["forward_compute_time"], "forward_compute_time", path, number)
    backward_ms = _number(stats["backward_compute_time"], "backward_compute_time", path, number)
    activation_text = stats["activation_size"]
    if activation_text.startswith("[") and activation_text.endswith("]"):
        entries = [e for e in activation_text[1:-1].split(";") if e.strip()]
        if not entries:
            raise ProfileError(f"{path}:{number}: activation_size: empty list")
        activation = tuple(_number(e, "activation_size", path, number) for e in entries)
    else:
        activation = (_number(activation_text, "activation_size", path, number),)
    param_bytes = _number(stats["parameter_size"], "parameter_size", path, number)
    return PipeDreamLayer(node, layer_repr, _layer_kind(layer_repr), forward_ms * 1e-3, backward_ms * 1e-3,
                          activation, param_bytes, number, stage)


def pipedream_stages(path: str | Path) -> dict[str, int] | None:
    """The stage of every layer of a partitioned graph.txt (``node -> stage``), None for a plain profile.

    A partitioned file (PipeDream's optimizer output) ends every node line with `` -- stage_id=N``.
    The ids must be 0..S-1, each used, on every node line, and never decrease along an edge, so that
    each stage is a contiguous run of some topological order; otherwise a ProfileError names the line.
    """
    path = Path(path)
    layers, edges = parse_pipedream(path)
    staged = [layer for layer in layers if layer.stage is not None]
    if not staged:
        return None
    if len(staged) != len(layers):
        bare = next(layer for layer in layers if layer.stage is None)
        raise ProfileError(f"{path}:{bare.line}: node {bare.node} has no stage_id, while {len(staged)} of "
                           f"{len(layers)} node lines have one (a partitioned file gives every node its stage)")
    for layer in layers:
        if layer.stage >= len(layers):
            raise ProfileError(f"{path}:{layer.line}: node {layer.node}: stage_id {layer.stage} is out of range "
                               f"({len(layers)} node lines make at most {len(layers)} stages, ids 0..{len(layers) - 1})")
    stage = {layer.node: int(layer.stage) for layer in layers}
    used = sorted(set(stage.values()))
    if used != list(range(len(used))):
        missing = next(i for i, s in enumerate(used) if s != i)  # the first gap; no set of range(max id)
        raise ProfileError(f"{path}: stage ids must be 0..S-1 with every stage used; stage {missing} holds no "
                           f"layer (ids used: {', '.join(map(str, used))})")
    for src, dst, number in edges:
        if stage[src] > stage[dst]:
            raise ProfileError(f"{path}:{number}: edge {src} -- {dst} goes from stage {stage[src]} back to "
                               f"stage {stage[dst]}; the stages are not contiguous in topological order")
    return stage


def _number(text: str, key: str, path: Path, number: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"{path}:{number}: {key}: cannot parse {text.strip()!r} as a number") from None
    if not math.isfinite(value) or value < 0:
        raise ProfileError(f"{path}:{number}: {key} must be a finite non-negative number, got {text.strip()!r}")
    return value


def _clip(text: str, width: int = 80) -> str:
    text = text.strip()
    return text if len(text) <= width else text[: width - 3] + "..."


def _layer_kind(layer_repr: str) -> str:
    match = re.match(r"\s*([A-Za-z_][\w]*)", layer_repr)
    return match.group(1) if match else layer_repr.strip()


def _check_acyclic(path: Path, nodes: list[str], edges: list[tuple[str, str, int]]) -> None:
    """ProfileError at the line of the last edge (in file order) of a cycle, naming the cycle."""
    succ: dict[str, list[tuple[str, int]]] = {n: [] for n in nodes}
    indegree = dict.fromkeys(nodes, 0)
    for src, dst, number in edges:
        succ[src].append((dst, number))
        indegree[dst] += 1
    ready = [n for n in nodes if indegree[n] == 0]
    while ready:
        node = ready.pop()
        for nxt, _ in succ[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    remaining = {n for n in nodes if indegree[n] > 0}
    if not remaining:
        return
    # Every remaining node has a remaining predecessor: walk predecessors until one repeats.
    pred = {n: [(s, number) for s, d, number in edges if d == n and s in remaining] for n in remaining}
    walk: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    node = min(remaining, key=nodes.index)
    while node not in seen:
        seen[node] = len(walk)
        src, number = pred[node][0]
        walk.append((node, number))
        node = src
    cycle = walk[seen[node]:][::-1]  # (node, line of the edge into it), in forward order
    closing = max(range(len(cycle)), key=lambda k: cycle[k][1])  # the cycle's last edge in the file
    cycle = cycle[closing:] + cycle[:closing]
    names = [name for name, _ in cycle] + [cycle[0][0]]
    raise ProfileError(f"{path}:{cycle[0][1]}: edge {names[-2]} -- {names[-1]} closes a cycle: {' -> '.join(names)}")


# ------------------------------------------------------------------------------------------------ repr parsing


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _call_arguments(call: str) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments of ``Name(a, b, key=value)``, values as int/float/bool/tuple."""
    open_at = call.find("(")
    if open_at < 0 or not call.rstrip().endswith(")"):
        return [], {}
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for part in _split_top_level(call[open_at + 1: call.rstrip().rfind(")")]):
        key, sep, value = part.partition("=")
        if sep and _IDENTIFIER.match(key.strip()):
            keywords[key.strip()] = _value(value.strip())
        else:
            positional.append(_value(part))
    return positional, keywords


def _value(text: str) -> Any:
    if text.startswith("(") and text.endswith(")"):
        return tuple(_value(p) for p in _split_top_level(text[1:-1]))
    if text in ("True", "False"):
        return text == "True"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _leaf_calls(layer_repr: str) -> list[str]:
    """The ``LSTM(...)``, ``Linear(...)``… calls inside a repr, in order, parentheses balanced."""
    calls = []
    for match in _LEAF_PATTERN.finditer(layer_repr):
        depth = 0
        for end in range(match.end() - 1, len(layer_repr)):
            depth += {"(": 1, ")": -1}.get(layer_repr[end], 0)
            if depth == 0:
                calls.append(layer_repr[match.start(): end + 1])
                break
    return calls


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    if isinstance(value, (int, float)):
        return int(value), int(value)
    raise ValueError(f"not a kernel size: {value!r}")


def _argument(positional: list[Any], keywords: dict[str, Any], index: int, name: str, default: Any = None) -> Any:
    if name in keywords:
        return keywords[name]
    if index < len(positional):
        return positional[index]
    if default is not None:
        return default
    raise ValueError(f"missing argument {name!r}")


class _Leaf(NamedTuple):
    kind: str
    width: float  # output features per row (token, pixel)
    params: float  # parameter elements
    flops_per_row: float  # forward FLOPs per output row


def _leaf(call: str) -> _Leaf:
    """Width, parameter count and FLOPs per output row of a Linear / LSTM / GRU / Conv2d / Embedding."""
    leaf = _leaf_unchecked(call)
    if not (leaf.width > 0 and leaf.params >= 0 and leaf.flops_per_row > 0):
        raise ValueError(f"non-positive size in {_clip(call)}")
    return leaf


def _leaf_unchecked(call: str) -> _Leaf:
    kind = _layer_kind(call)
    positional, keywords = _call_arguments(call)
    if kind == "Linear":
        fan_in = float(_argument(positional, keywords, 0, "in_features"))
        width = float(_argument(positional, keywords, 1, "out_features"))
        bias = bool(keywords.get("bias", True))
        return _Leaf(kind, width, width * fan_in + (width if bias else 0.0), width * (2.0 * fan_in + bias))
    if kind in ("LSTM", "GRU"):
        gates = 4 if kind == "LSTM" else 3
        size_in = float(_argument(positional, keywords, 0, "input_size"))
        hidden = float(_argument(positional, keywords, 1, "hidden_size"))
        layers = int(_argument(positional, keywords, 2, "num_layers", 1))
        directions = 2 if keywords.get("bidirectional", False) else 1
        bias = bool(keywords.get("bias", True))
        params = flops = 0.0
        for layer in range(layers):
            fan_in = size_in if layer == 0 else hidden * directions
            params += directions * (gates * hidden * (fan_in + hidden) + (2 * gates * hidden if bias else 0.0))
            # 2 FLOPs per MAC of the gate matmuls, ~10 per gate output for the cell's element-wise work
            flops += directions * (2.0 * gates * hidden * (fan_in + hidden) + 10.0 * gates * hidden)
        return _Leaf(kind, hidden * directions, params, flops)
    if kind == "Conv2d":
        channels_in = float(_argument(positional, keywords, 0, "in_channels"))
        width = float(_argument(positional, keywords, 1, "out_channels"))
        kh, kw = _pair(_argument(positional, keywords, 2, "kernel_size"))
        groups = float(keywords.get("groups", 1))
        bias = bool(keywords.get("bias", True))
        if groups <= 0:
            raise ValueError(f"groups must be positive in {_clip(call)}")
        fan_in = channels_in / groups * kh * kw
        return _Leaf(kind, width, width * fan_in + (width if bias else 0.0), width * (2.0 * fan_in + bias))
    if kind == "Embedding":
        rows = float(_argument(positional, keywords, 0, "num_embeddings"))
        width = float(_argument(positional, keywords, 1, "embedding_dim"))
        return _Leaf(kind, width, rows * width, width)
    raise ValueError(f"not a leaf layer: {kind}")


# ------------------------------------------------------------------------------------------------ estimates


def _forward_estimate(layer: PipeDreamLayer, input_bytes: float) -> _Estimate:
    """FLOPs and bytes of a layer's forward pass at the profiled batch (see the module docstring)."""
    out_bytes = layer.activation_bytes
    out_elements = layer.activation[0] / _DTYPE_BYTES  # the primary output
    kind = layer.kind
    traffic = input_bytes + out_bytes + layer.param_bytes
    if kind in _ZERO_COST:
        return _Estimate(0.0, 0.0, True)
    if kind in _ELEMENTWISE:
        flops_per_element, extra_reads = _ELEMENTWISE[kind]
        extra = input_bytes * extra_reads + (out_elements if kind.startswith("Dropout") else 0.0)  # 1-byte mask
        return _Estimate(flops_per_element * out_elements, traffic + extra, True)
    if kind in _POOLING:
        positional, keywords = _call_arguments(layer.module)
        try:
            kh, kw = _pair(_argument(positional, keywords, 0, "kernel_size"))
            flops = out_elements * kh * kw
        except (ValueError, TypeError):
            flops = input_bytes / _DTYPE_BYTES  # adaptive pooling: every input element once
        return _Estimate(flops, traffic, True)
    calls = _leaf_calls(layer.module)
    try:
        leaves = [_leaf(call) for call in calls]
    except (ValueError, TypeError) as exc:
        log.warning("%s (%s): cannot read layer arguments (%s); estimating bytes only", layer.node, kind, exc)
        return _Estimate(0.0, traffic, False)
    if not leaves:
        log.warning("%s: unknown layer kind %r; estimating bytes only", layer.node, kind)
        return _Estimate(0.0, traffic, False)
    if leaves[0].kind == "Embedding" and len(leaves) == 1:
        # Read the looked-up rows and write them: the table itself is not streamed.
        return _Estimate(out_elements, input_bytes + 2.0 * out_bytes, True)
    rows = out_elements / leaves[0].width
    flops = 0.0
    budget = layer.param_bytes / _DTYPE_BYTES
    used = 0.0
    for leaf in leaves:
        if budget > 0 and used + leaf.params > budget * 1.001 + 1.0:
            continue  # a weight-tied alternative of a leaf already counted
        used += leaf.params
        flops += rows * leaf.flops_per_row
    composite = len(calls) > 1 or kind not in _LEAVES
    if composite:
        flops += 4.0 * sum(layer.activation) / _DTYPE_BYTES  # element-wise glue between the leaves
    return _Estimate(flops, traffic, True)


def _backward_estimate(layer: PipeDreamLayer, forward: _Estimate) -> tuple[float, float]:
    if layer.kind == "Embedding":
        return layer.activation[0] / _DTYPE_BYTES, 2.0 * layer.param_bytes + layer.activation_bytes
    if layer.param_bytes > 0:
        return 2.0 * forward.flops, 2.0 * forward.bytes
    return forward.flops, 1.5 * forward.bytes


# ------------------------------------------------------------------------------------------------ batch size


def _infer_batch_size(layers: list[PipeDreamLayer], sinks: set[str], order: list[int]) -> tuple[int | None, str]:
    def whole(value: float) -> int | None:
        rounded = round(value)
        return int(rounded) if rounded >= 1 and abs(value - rounded) < 1e-6 * max(1.0, value) else None

    for layer in layers:
        if layer.kind in ("LSTM", "GRU") and len(layer.activation) >= 2:
            try:
                positional, keywords = _call_arguments(layer.module)
                hidden = float(_argument(positional, keywords, 1, "hidden_size"))
                depth = int(_argument(positional, keywords, 2, "num_layers", 1))
            except (ValueError, TypeError):
                continue
            directions = 2 if keywords.get("bidirectional", False) else 1
            batch = whole(layer.activation[1] / (_DTYPE_BYTES * hidden * depth * directions))
            if batch:
                return batch, f"{layer.node} ({layer.kind}) hidden state"
    for i in reversed(order):
        layer = layers[i]
        if layer.kind == "Linear" and layer.node in sinks:
            positional, keywords = _call_arguments(layer.module)
            try:
                width = float(_argument(positional, keywords, 1, "out_features"))
            except (ValueError, TypeError):
                continue
            batch = whole(layer.activation_bytes / (_DTYPE_BYTES * width))
            if batch:
                return batch, f"{layer.node} (final Linear) output"
    for layer in layers:
        if _INPUT_KIND.match(layer.kind) and layer.activation_bytes > 0:
            batch = whole(layer.activation_bytes / _IMAGE_BYTES)
            if batch:
                return batch, f"{layer.node} (Input) as 3x224x224 fp32 images"
    return None, "not inferred"


# ------------------------------------------------------------------------------------------------ graph


class _OpTable:
    """OpGraph columns and edges, appended op by op."""

    _COLUMNS = ("names", "kinds", "role", "flops", "bytes_accessed", "output_bytes", "param_bytes", "batch_scaled",
                "split", "measured_time", "args")

    def __init__(self) -> None:
        self.columns: dict[str, list] = {k: [] for k in self._COLUMNS}
        self.edges: tuple[list[int], list[int], list[float], list[bool]] = ([], [], [], [])

    def add(self, layer: PipeDreamLayer, step: str, kind: str, role: int, *, flops: float, nbytes: float,
            output: float, params: float, scaled: bool, split: int, measured: float) -> int:
        """Append the ``step`` ("input", "forward", "backward", "optimizer") op of ``layer``; its index."""
        values = (f"{layer.node}.{step}", kind, role, flops, nbytes, output, params, scaled, split, measured,
                  {"layer": layer.node, "module": layer.module, "pass": step, "line": layer.line})
        for key, value in zip(self._COLUMNS, values):
            self.columns[key].append(value)
        return len(self.columns["names"]) - 1

    def connect(self, src: int, dst: int, nbytes: float, *, batch_scaled: bool = True) -> None:
        for column, value in zip(self.edges, (src, dst, nbytes, batch_scaled)):
            column.append(value)

    def to_graph(self, batch_size: int, meta: dict[str, Any]) -> OpGraph:
        src, dst, nbytes, scaled = self.edges
        return OpGraph(**self.columns, edge_src=src, edge_dst=dst, edge_bytes=nbytes, edge_batch_scaled=scaled,
                       batch_size=batch_size, meta=meta)


def load_pipedream(path: str | Path, *, batch_size: int | None = None,
                   measured_on: str | None = DEFAULT_MEASURED_ON) -> OpGraph:
    """The forward + backward + optimizer OpGraph of a PipeDream ``graph.txt`` (module docstring).

    ``batch_size`` states the batch the profile was taken at (overriding the inference); to plan for
    another batch, call ``graph.with_batch_size(b)`` on the result. ``measured_on`` names the GPU type
    of the measured times (``None``: unknown, the cost model then ignores them).
    """
    path = Path(path)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ProfileError(f"{path}: batch_size must be a positive integer, got {batch_size!r}")
    layers, edges = parse_pipedream(path)
    index = {layer.node: i for i, layer in enumerate(layers)}
    preds: list[list[int]] = [[] for _ in layers]
    for src, dst, _ in edges:
        preds[index[dst]].append(index[src])
    order = _layer_order(layers, preds)
    is_input = [(_INPUT_KIND.match(layer.kind) is not None) or (not preds[i] and layer.param_bytes == 0)
                for i, layer in enumerate(layers)]
    table = _OpTable()
    forward_op, backward_op, optimizer_op = _add_ops(table, layers, preds, order, is_input, path.name)
    for src, dst, _ in edges:
        u, v = index[src], index[dst]
        table.connect(forward_op[u], forward_op[v], layers[u].activation_bytes)
        if u in backward_op and v in backward_op:
            table.connect(backward_op[v], backward_op[u], layers[u].activation_bytes)  # the gradient of u's output
    for i, op in backward_op.items():
        table.connect(forward_op[i], op, layers[i].activation_bytes)  # saved for the backward pass
    for i, op in optimizer_op.items():
        table.connect(backward_op[i], op, layers[i].param_bytes, batch_scaled=False)  # the weight gradient

    sinks = {layer.node for layer in layers} - {src for src, _, _ in edges}
    inferred, how = _infer_batch_size(layers, sinks, order)
    if batch_size is not None:
        how = "given"
    elif inferred is None:
        log.warning("%s: cannot infer the profiled batch size; assuming 1 (pass batch_size=)", path.name)
    meta = {
        "model": path.name.removesuffix(".txt").removesuffix(".graph"),
        "source": "pipedream",
        "profile": path.name,
        "measured_on": measured_on,
        "measured_dtype": "fp32",
        "batch_size_inferred": batch_size is None and inferred is not None,
        "batch_size_source": how,
        "input_load_time": {layers[i].node: layers[i].forward_time
                            for i in order if is_input[i] and layers[i].forward_time > 0},
        "param_dtype_bytes": _DTYPE_BYTES,
        "layers": len(layers),
    }
    return table.to_graph(int(batch_size or inferred or 1), meta)


def _add_ops(table: _OpTable, layers: list[PipeDreamLayer], preds: list[list[int]], order: list[int],
             is_input: list[bool], where: str) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """Forward ops in topological order, backward ops in reverse, then optimizer ops: layer → op maps."""
    forward_op: dict[int, int] = {}
    backward_op: dict[int, int] = {}
    optimizer_op: dict[int, int] = {}
    estimates: dict[int, _Estimate] = {}
    for i in order:
        layer = layers[i]
        if is_input[i]:
            forward_op[i] = table.add(layer, "input", layer.kind, ROLE_INPUT, flops=0.0, nbytes=0.0,
                                      output=layer.activation_bytes, params=0.0, scaled=True, split=SPLIT_CONCAT,
                                      measured=math.nan)
            continue
        input_bytes = float(sum(layers[p].activation_bytes for p in set(preds[i])))
        estimate = estimates[i] = _forward_estimate(layer, input_bytes)
        forward_op[i] = table.add(layer, "forward", layer.kind, ROLE_FORWARD, flops=estimate.flops,
                                  nbytes=estimate.bytes, output=layer.activation_bytes, params=layer.param_bytes,
                                  scaled=True, split=SPLIT_CONCAT, measured=_measured(layer.forward_time, estimate.flops, estimate.bytes))
    for i in reversed(order):
        if is_input[i]:
            continue
        layer = layers[i]
        flops, nbytes = _backward_estimate(layer, estimates[i])
        input_gradients = float(sum(layers[p].activation_bytes for p in set(preds[i]) if not is_input[p]))
        backward_op[i] = table.add(layer, "backward", f"{layer.kind}.backward", ROLE_BACKWARD, flops=flops,
                                   nbytes=nbytes, output=input_gradients + layer.param_bytes, params=0.0, scaled=True,
                                   split=SPLIT_SUM if layer.param_bytes > 0 else SPLIT_CONCAT,
                                   measured=_measured(layer.backward_time, flops, nbytes))
    for i in order:
        layer = layers[i]
        if not is_input[i] and layer.param_bytes > 0:
            optimizer_op[i] = table.add(layer, "optimizer", "Adam", ROLE_OPTIMIZER,
                                        flops=_ADAM_FLOPS_PER_PARAMETER * layer.param_bytes / _DTYPE_BYTES,
                                        nbytes=_ADAM_BYTES_PER_PARAM_BYTE * layer.param_bytes,
                                        output=layer.param_bytes, params=0.0, scaled=False, split=SPLIT_NONE,
                                        measured=math.nan)
    unknown = sorted({layers[i].kind for i, estimate in estimates.items() if not estimate.known})
    if unknown:
        log.warning("%s: layer kind(s) %s costed by bytes only", where, ", ".join(unknown))
    return forward_op, backward_op, optimizer_op


def _measured(milliseconds_as_seconds: float, flops: float, nbytes: float) -> float:
    """The measured time, or NaN where PipeDream did not time a layer that does work.

    PipeDream reports 0 ms for functional layers it does not time (Add, Concat, some Dropouts); taking
    that at face value would make them free on every GPU, so they keep the roofline estimate instead.
    """
    if milliseconds_as_seconds == 0.0 and (flops > 0 or nbytes > 0):
        return math.nan
    return milliseconds_as_seconds


def _layer_order(layers: list[PipeDreamLayer], preds: list[list[int]]) -> list[int]:
    """A topological order of the layers, ties broken by the node's number (then file order)."""
    import heapq

    def key(i: int) -> tuple[int, int]:
        digits = re.sub(r"\D", "", layers[i].node)
        return (int(digits) if digits else 1 << 30, i)

    succ: list[list[int]] = [[] for _ in layers]
    indegree = [0] * len(layers)
    for v, sources in enumerate(preds):
        for u in sources:
            succ[u].append(v)
            indegree[v] += 1
    heap = [key(i) for i in range(len(layers)) if indegree[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for v in succ[i]:
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(heap, key(v))
    return order
