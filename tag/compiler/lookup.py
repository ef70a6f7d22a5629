"""Look-ups of the search's evaluator: group keys, fragments of the previous call, templates of pair
fragments, interned ids, and the dependencies inside a group that longer paths imply
(:mod:`tag.compiler.evaluate`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tag._compiled import jit
from tag.grouping.acyclic import dag_order

def _implied_edges(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """[E] whether each edge a -> c of a DAG is implied by a longer path (a -> b -> ... -> c, b not c): the
    edges its transitive reduction drops (a repeated direct edge is not implied by its twin)."""
    succ: list[list[int]] = [[] for _ in range(num_nodes)]
    for a, c in zip(src.tolist(), dst.tolist()):
        succ[a].append(c)
    reach = [0] * num_nodes  # bit set of the nodes each one reaches by a path of one edge or more
    for v in dag_order(num_nodes, src, dst)[::-1].tolist():
        bits = 0
        for c in succ[v]:
            bits |= reach[c] | (1 << c)
        reach[v] = bits
    return np.array([any(b != c and reach[b] >> c & 1 for b in succ[a]) for a, c in zip(src.tolist(), dst.tolist())],
                    dtype=np.bool_)


def _interned(ids: dict, key: Any, bits: int) -> int:
    """The id of ``key`` in ``ids`` (the next one, stored, if it is new); -1 if new past ``bits`` bits."""
    found = ids.get(key)
    if found is None:
        found = len(ids)
        if found >= 1 << bits:
            return -1
        ids[key] = found
    return found



@jit
def _group_keys(placement, option, split, num_options, num_splits):
    """[G] :meth:`StrategyEvaluator._group_keys` where they fit in an int64: each group's placement row [G, M]
    (bool) as bits, its option and the batch split ``split``, and the group, in one number."""
    g = option.size
    keys = np.empty(g, dtype=np.int64)
    for k in range(g):
        code = np.int64(0)
        for j in range(placement.shape[1]):
            if placement[k, j]:
                code |= np.int64(1) << np.int64(j)
        keys[k] = ((code * num_options + option[k]) * num_splits + split) * g + k
    return keys


@jit
def _changed_look_up(keys, last_keys, last_ids, table):
    """[n] the value of each of ``keys`` [n]: the previous call's (``last_ids``) where its key
    (``last_keys``; empty: none) is the same, else ``table``'s, -1 where it has none."""
    ids = np.empty(keys.size, dtype=np.int64)
    same = last_keys.size == keys.size
    for i in range(keys.size):
        if same and keys[i] == last_keys[i]:
            ids[i] = last_ids[i]
        else:
            ids[i] = table.get(keys[i], -1)
    return ids


@jit
def _pair_look_up(groups, last_groups, last_ids, pair_p, pair_c, table):
    """([P] pair fragment of each pair of groups pair_p -> pair_c, -1 where ``table`` has none; [P] its key,
    the two group fragments ``groups`` [G], P's in the high 32 bits). A pair both of whose group fragments
    are those of the previous call (``last_groups``; empty: none) keeps its fragment there (``last_ids``)."""
    ids = np.empty(pair_p.size, dtype=np.int64)
    codes = np.empty(pair_p.size, dtype=np.int64)
    same = last_groups.size == groups.size
    for k in range(pair_p.size):
        fp, fc = groups[pair_p[k]], groups[pair_c[k]]
        codes[k] = (fp << 32) | fc
        if same and fp == last_groups[pair_p[k]] and fc == last_groups[pair_c[k]]:
            ids[k] = last_ids[k]
        else:
            ids[k] = table.get(codes[k], -1)
    return ids, codes


@jit
def _template_look_up(row_p, row_c, classes, templates, row_bits):
    """The templates of M new pairs of group fragments, given their layouts' rows (``row_p``, ``row_c`` [M], -1:
    none) and their classes ([M], -1: none): (fragment [M] of each pair whose template ``templates`` holds, -1
    for the others; the positions of the pairs to build, ascending: those without a template and the first
    pair of each new one, its *leader*; leader [M], the leader of each pair of a new template, -1 for the
    others; code [M] of each template, -1 without)."""
    m = row_p.size
    out = np.full(m, -1, dtype=np.int64)
    leader = np.full(m, -1, dtype=np.int64)
    codes = np.full(m, -1, dtype=np.int64)
    new = np.empty(m, dtype=np.int64)  # the pairs of new templates, ascending
    num_new = 0
    for i in range(m):
        if row_p[i] >= 0 and row_c[i] >= 0 and classes[i] >= 0:
            codes[i] = (classes[i] << (2 * row_bits)) | (row_p[i] << row_bits) | row_c[i]
            out[i] = templates.get(codes[i], -1)
            if out[i] < 0:
                new[num_new] = i
                num_new += 1
    order = np.argsort(codes[new[:num_new]], kind="mergesort")  # stable: a run of one code starts at its leader
    for k in range(num_new):
        i = new[order[k]]
        if k == 0 or codes[i] != codes[new[order[k - 1]]]:
            first = i
        leader[i] = first
    build = np.empty(m, dtype=np.int64)
    num_build = 0
    for i in range(m):
        if codes[i] < 0 or leader[i] == i:
            build[num_build] = i
            num_build += 1
    return out, build[:num_build].copy(), leader, codes
