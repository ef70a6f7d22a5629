"""Fingerprints that tie a plan to its model and its grouping.

:func:`graph_fingerprint` is sha256 over a canonical encoding of what a plan depends on: op names,
kinds, roles, split classes, batch scaling, the four cost columns (FLOPs, bytes accessed, output bytes,
parameter bytes, rounded to 9 significant digits so that recomputing them by another order of float
arithmetic keeps the identity), the reference batch size, and the edges (source, target, bytes, batch
scaling) sorted by (source, target) so that listing edges in another order does not matter. Op order does
matter: a grouping refers to ops by index. Left out: ``meta`` (the model's name is not its identity, as
for clusters), ``args`` (executor detail) and ``measured_time`` (a profile of the same model).
The encoding is explicit little-endian bytes, so the hex digest is the same across runs and machines.
"""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

import numpy as np

from tag.graph import OpGraph

__all__ = ["graph_fingerprint", "grouping_fingerprint"]

_SIGNIFICANT_DIGITS = 9
_GRAPH_DOMAIN = b"tag.opgraph.fingerprint.v1"
_GROUPING_DOMAIN = b"tag.grouping.fingerprint.v1"


def graph_fingerprint(graph: OpGraph) -> str:
    """sha256 hex digest of the canonical form of ``graph`` (see the module docstring)."""
    digest = hashlib.sha256(_GRAPH_DOMAIN)

    def add(label: str, data: bytes) -> None:
        # Length-prefixed fields: no two different graphs can produce the same byte stream.
        digest.update(label.encode())
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    add("names", _strings(graph.names))
    add("kinds", _strings(graph.kinds))
    add("role", graph.role.astype("<i1").tobytes())
    add("split", graph.split.astype("<i1").tobytes())
    add("batch_scaled", graph.batch_scaled.astype("<i1").tobytes())
    for column in ("flops", "bytes_accessed", "output_bytes", "param_bytes"):
        add(column, _floats(getattr(graph, column)))
    add("batch_size", int(graph.batch_size).to_bytes(8, "little"))
    order = np.lexsort((graph.edge_dst, graph.edge_src))
    add("edge_src", graph.edge_src[order].astype("<i8").tobytes())
    add("edge_dst", graph.edge_dst[order].astype("<i8").tobytes())
    add("edge_bytes", _floats(graph.edge_bytes[order]))
    add("edge_batch_scaled", graph.edge_batch_scaled[order].astype("<i1").tobytes())
    return digest.hexdigest()


def grouping_fingerprint(assignment: Sequence[int] | np.ndarray) -> str:
    """sha256 hex digest of an op → op-group assignment [N]."""
    values = np.asarray(assignment, dtype=np.int64).reshape(-1)
    return hashlib.sha256(_GROUPING_DOMAIN + values.astype("<i8").tobytes()).hexdigest()


def _strings(values: Sequence[str]) -> bytes:
    return json.dumps(list(values), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _floats(values: np.ndarray) -> bytes:
    """Rounded to significant digits; -0.0 becomes 0.0."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values) & (values != 0)
    exponent = np.floor(np.log10(np.abs(np.where(finite, values, 1.0))))
    scale = 10.0 ** (_SIGNIFICANT_DIGITS - 1 - exponent)
    rounded = np.where(finite, np.round(values * scale) / scale, values) + 0.0
    return rounded.astype("<f8").tobytes()
