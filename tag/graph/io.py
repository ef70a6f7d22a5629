"""OpGraph JSON(.gz) files: a versioned, column-wise schema, validated on load.

Layout (schema_version 1)::

    {"format": "tag.opgraph", "schema_version": 1, "batch_size": 96, "meta": {...},
     "ops": {"name": [...], "kind": [...], "role": ["forward", ...], "flops": [...],
             "bytes_accessed": [...], "output_bytes": [...], "param_bytes": [...],
             "batch_scaled": [...], "split": ["concat", ...], "measured_time": [... or null],
             "args": [...] (optional)},
     "edges": {"src": [...], "dst": [...], "bytes": [...], "batch_scaled": [...] (optional)}}
"""

from __future__ import annotations

import gzip
import json
import math
import os
from typing import Any

import numpy as np

from tag._atomic import atomic_write_bytes
from tag._read import parse_json, read_input
from tag._schema import check_header
from tag.cluster.gpus import DTYPES, gpu_type
from tag.errors import GraphError, SchemaError, TagError
from tag.graph.opgraph import ROLES, SPLIT_CLASSES, OpGraph

__all__ = ["SCHEMA_VERSION", "graph_to_json", "graph_from_json", "save_graph", "load_graph"]

SCHEMA_VERSION = 1
_FORMAT = "tag.opgraph"
_NUMBER_COLUMNS = ("flops", "bytes_accessed", "output_bytes", "param_bytes")


def graph_to_json(graph: OpGraph) -> dict[str, Any]:
    measured = [None if math.isnan(t) else float(t) for t in graph.measured_time]
    ops: dict[str, Any] = {
        "name": list(graph.names),
        "kind": list(graph.kinds),
        "role": [ROLES[r] for r in graph.role],
        **{column: getattr(graph, column).tolist() for column in _NUMBER_COLUMNS},
        "batch_scaled": graph.batch_scaled.tolist(),
        "split": [SPLIT_CLASSES[s] for s in graph.split],
        "measured_time": measured,
    }
    if graph.args is not None:
        ops["args"] = graph.args
    return {
        "format": _FORMAT,
        "schema_version": SCHEMA_VERSION,
        "batch_size": graph.batch_size,
        "meta": graph.meta,
        "ops": ops,
        "edges": {"src": graph.edge_src.tolist(), "dst": graph.edge_dst.tolist(), "bytes": graph.edge_bytes.tolist(),
                  "batch_scaled": graph.edge_batch_scaled.tolist()},
    }


def _field(doc: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(doc, dict) or key not in doc:
        raise SchemaError(f"{where}: missing field {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SchemaError(f"{where}: field {key!r} must be {expected}, got {type(value).__name__}")
    return value


def _column(ops: dict, key: str, n: int, where: str, element: type | tuple[type, ...], *, nullable=False) -> list:
    values = _field(ops, key, list, f"{where}.ops")
    if len(values) != n:
        raise SchemaError(f"{where}: ops.{key} has {len(values)} entries, expected {n} (one per op)")
    for i, value in enumerate(values):
        if value is None and nullable:
            continue
        if isinstance(value, bool) and element is not bool or not isinstance(value, element):
            raise SchemaError(f"{where}: ops.{key}[{i}] must be {getattr(element, '__name__', 'a number')}, got {value!r}")
    return values


def _labels(values: list, vocabulary: tuple[str, ...], key: str, where: str) -> np.ndarray:
    index = {label: i for i, label in enumerate(vocabulary)}
    out = np.empty(len(values), dtype=np.int8)
    for i, label in enumerate(values):
        if label not in index:
            raise SchemaError(f"{where}: ops.{key}[{i}] is {label!r}; expected one of {', '.join(vocabulary)}")
        out[i] = index[label]
    return out


def _check_meta(meta: dict, where: str) -> None:
    """The meta fields that tag itself reads must have the right type; the rest is free-form."""
    parameters = meta.get("parameters")
    if parameters is not None and (isinstance(parameters, bool) or not isinstance(parameters, int) or parameters < 0):
        raise SchemaError(f"{where}: meta.parameters must be a non-negative integer, got {parameters!r}")
    dtype = meta.get("measured_dtype")
    if dtype is not None and dtype not in DTYPES:
        raise SchemaError(f"{where}: meta.measured_dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    measured_on = meta.get("measured_on")
    if measured_on is not None:
        try:
            gpu_type(measured_on)
        except TagError as error:
            raise SchemaError(f"{where}: meta.measured_on: {error}") from None


def graph_from_json(doc: Any, *, where: str = "graph") -> OpGraph:
    """Validate a decoded JSON document and build the OpGraph; SchemaError/GraphError name the field."""
    check_header(doc, fmt=_FORMAT, version=SCHEMA_VERSION, where=where)
    batch_size = _field(doc, "batch_size", int, where)
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise SchemaError(f"{where}: field 'meta' must be an object")
    _check_meta(meta, where)
    ops = _field(doc, "ops", dict, where)
    names = _field(ops, "name", list, f"{where}.ops")
    n = len(names)
    _column(ops, "name", n, where, str)
    kinds = _column(ops, "kind", n, where, str)
    role = _labels(_column(ops, "role", n, where, str), ROLES, "role", where)
    split = _labels(_column(ops, "split", n, where, str), SPLIT_CLASSES, "split", where)
    numbers = {c: np.asarray(_column(ops, c, n, where, (int, float)), dtype=np.float64) for c in _NUMBER_COLUMNS}
    batch_scaled = np.asarray(_column(ops, "batch_scaled", n, where, bool), dtype=bool)
    measured = ops.get("measured_time")
    if measured is None:
        measured_time = np.full(n, np.nan)
    else:
        values = _column(ops, "measured_time", n, where, (int, float), nullable=True)
        measured_time = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    args = ops.get("args")
    if args is not None and (not isinstance(args, list) or len(args) != n):
        raise SchemaError(f"{where}: ops.args must be a list with one entry per op")
    edges = _field(doc, "edges", dict, where)
    columns = {}
    for key, element in (("src", int), ("dst", int), ("bytes", (int, float))):
        values = _field(edges, key, list, f"{where}.edges")
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, element):
                raise SchemaError(f"{where}: edges.{key}[{i}] must be a number, got {value!r}")
        columns[key] = values
    if not len(columns["src"]) == len(columns["dst"]) == len(columns["bytes"]):
        raise SchemaError(f"{where}: edges.src, edges.dst and edges.bytes must have the same length")
    edge_scaled = edges.get("batch_scaled")  # optional: derived from the producers when absent
    if edge_scaled is not None:
        if not isinstance(edge_scaled, list) or len(edge_scaled) != len(columns["src"]):
            raise SchemaError(f"{where}: edges.batch_scaled must be a list with one entry per edge")
        bad = [i for i, v in enumerate(edge_scaled) if not isinstance(v, bool)]
        if bad:
            raise SchemaError(f"{where}: edges.batch_scaled[{bad[0]}] must be true or false")
    try:
        graph = OpGraph(
            names=names, kinds=kinds, role=role, split=split, batch_scaled=batch_scaled,
            edge_src=np.asarray(columns["src"], dtype=np.int64),
            edge_dst=np.asarray(columns["dst"], dtype=np.int64),
            edge_bytes=np.asarray(columns["bytes"], dtype=np.float64),
            edge_batch_scaled=None if edge_scaled is None else np.asarray(edge_scaled, dtype=bool),
            batch_size=batch_size, measured_time=measured_time, args=args, meta=meta, **numbers,
        )
        graph.topological_order()
    except GraphError as error:
        raise GraphError(f"{where}: {error}") from None
    return graph


def save_graph(graph: OpGraph, path: str | os.PathLike) -> None:
    """Write JSON, gzipped when the name ends in .gz; atomically."""
    data = json.dumps(graph_to_json(graph), separators=(",", ":")).encode("utf-8")
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    atomic_write_bytes(path, data)


def load_graph(path: str | os.PathLike) -> OpGraph:
    raw = read_input(path, what="graph file", error=SchemaError, gunzip=True)
    doc = parse_json(raw, where=str(path), error=SchemaError, malformed="not a valid JSON(.gz) graph file")
    try:
        return graph_from_json(doc, where=str(path))
    except (OverflowError, ValueError, TypeError) as error:
        if isinstance(error, SchemaError):
            raise
        raise SchemaError(f"{path}: a value is out of range ({error})") from None
