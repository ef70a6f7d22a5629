"""Parmesan Table III's shape: speed-up of the exact mapping over CS map on 64-device topologies.

For each model, topology and (S, R) ∈ {(4, 16), (8, 8), (16, 4)}: cut the model into S stages, solve the
mapping exactly (Parmesan Algorithms 1–2, instantiation chosen by the all-reduce : p2p ratio) and
report the max stage time of CS map over the exact mapping's, both under that instantiation, whether
the exact mapping is proven optimal (else its gap), and the solve time. A readable table goes to
stderr, one JSON line of the figures to stdout.

Stages here are a stand-in for a partitioner: the forward ops, in topological order, are cut into S
contiguous chunks of equal compute, backward and optimizer ops following the forward ops they
differentiate (tag.cost's CostModel on the cluster's GPU type).

    .venv/bin/python scripts/bench_mapping.py [--time-limit 60] [--models resnet152 bert-large]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import NamedTuple

import numpy as np

from tag.cluster import resolve_cluster
from tag.cost import CostModel
from tag.exact.heuristics import cs_map
from tag.exact.mapping import MappingProblem, max_stage_time, solve_mapping
from tag.graph.opgraph import ROLE_BACKWARD, ROLE_FORWARD, ROLE_INPUT, ROLE_OPTIMIZER, OpGraph
from tag.graph.resolve import resolve_model

log = logging.getLogger("bench_mapping")

TOPOLOGIES = {  # Table III's row names → tag cluster addresses (64 devices each)
    "2d mesh": "mesh2d:8x8",
    "2d torus": "torus2d:8x8",
    "random_blk_1": "random-blk-1:64,seed=0",
    "random_blk_2": "random-blk-2:64,seed=0",
    "uniform_dist": "uniform-dist:64,seed=0",
}
SHAPES = ((4, 16), (8, 8), (16, 4))


class Stages(NamedTuple):
    """A stage graph: what MappingProblem.from_stage_graph reads. Its edge bytes count every tensor
    crossing between two stages, activations forward and gradients back."""

    stage_time: np.ndarray  # [S] seconds
    edge_src: np.ndarray  # [E]
    edge_dst: np.ndarray  # [E]
    edge_bytes: np.ndarray  # [E]
    param_bytes: np.ndarray  # [S]


def forward_position(graph: OpGraph) -> np.ndarray:
    """[N] index into the forward ops (topological order) that each op belongs with.

    Forward ops: their own index. Parameters and other inputs read by forward ops: their first forward
    reader's. Backward ops: the latest forward op they read, else the earliest position among their
    backward inputs (gradients flow back). Optimizer ops: the latest position among their parameter and
    gradient inputs, else among their optimizer inputs. Whatever is left (optimizer state, step
    counters) goes with its first reader.
    """
    order = graph.topological_order()
    position = np.full(graph.num_ops, -1, dtype=np.int64)
    forward = [op for op in order if graph.role[op] == ROLE_FORWARD]
    position[forward] = np.arange(len(forward))
    for op in np.flatnonzero(graph.role == ROLE_INPUT):
        readers = [position[q] for q in graph.successors(op) if graph.role[q] == ROLE_FORWARD]
        position[op] = min(readers, default=-1)
    for op in order:
        role = graph.role[op]
        if role in (ROLE_FORWARD, ROLE_INPUT):
            continue
        preds = [p for p in graph.predecessors(op) if position[p] >= 0]
        if role == ROLE_BACKWARD:
            fwd = [position[p] for p in preds if graph.role[p] == ROLE_FORWARD]
            position[op] = max(fwd) if fwd else min((position[p] for p in preds), default=-1)
        else:
            direct = [position[p] for p in preds if graph.role[p] != ROLE_OPTIMIZER]
            position[op] = max(direct) if direct else max((position[p] for p in preds), default=-1)
    for op in reversed(order):  # the rest follow their first reader
        if position[op] < 0:
            readers = [position[q] for q in graph.successors(op) if position[q] >= 0]
            position[op] = min(readers, default=0)
    return position


def cut_stages(graph: OpGraph, num_stages: int, gpu: str) -> Stages:
    """S contiguous chunks of forward positions with equal compute (see the module docstring)."""
    times = CostModel().reference_times(graph, gpu)
    position = forward_position(graph)
    per_position = np.bincount(position, weights=times, minlength=position.max() + 1)
    cumulative = np.cumsum(per_position)
    bounds = cumulative[-1] * np.arange(1, num_stages) / num_stages
    stage_of_position = np.searchsorted(bounds, cumulative, side="left")
    stage = np.minimum(stage_of_position[position], num_stages - 1)
    stage_time = np.bincount(stage, weights=times, minlength=num_stages)
    param_bytes = np.bincount(stage, weights=graph.param_bytes, minlength=num_stages)
    # A tensor goes to another stage once, however many of its ops read it there.
    sent: dict[tuple[int, int], float] = {}
    for u, v, nbytes in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_bytes.tolist()):
        if stage[u] != stage[v]:
            sent[(u, int(stage[v]))] = max(sent.get((u, int(stage[v])), 0.0), nbytes)
    pairs: dict[tuple[int, int], float] = {}
    for (u, dst), nbytes in sent.items():
        key = (int(stage[u]), dst)
        pairs[key] = pairs.get(key, 0.0) + nbytes
    keys = sorted(pairs)
    return Stages(stage_time, np.array([a for a, _ in keys], dtype=np.int64),
                  np.array([b for _, b in keys], dtype=np.int64), np.array([pairs[k] for k in keys]), param_bytes)


def run_cell(model: str, graph: OpGraph, topology: str, address: str, shape: tuple[int, int],
             time_limit: float) -> dict:
    cluster = resolve_cluster(address)
    num_stages, replicas = shape
    stages = cut_stages(graph, num_stages, cluster.types[0].name)
    problem = MappingProblem.from_stage_graph(stages, replicas, cluster, transfers_per_edge=1.0)
    result = solve_mapping(problem, time_limit=time_limit)
    mode = result.instantiation
    cs = cs_map(problem)
    cs_time = max_stage_time(problem, cs, mode)
    return {
        "model": model, "topology": topology, "S": num_stages, "R": replicas, "instantiation": mode,
        "cs_time_s": cs_time, "exact_time_s": result.max_stage_time, "speedup": cs_time / result.max_stage_time,
        "speedup_full": max_stage_time(problem, cs, "full") / max_stage_time(problem, result.mapping, "full"),
        "proven": result.proven_optimal, "gap": result.gap, "lower_bound_s": result.lower_bound,
        "solve_time_s": result.solve_time_s, "nodes": result.nodes, "searches": result.searches,
    }


def format_table(cells: list[dict]) -> str:
    header = (f"{'model':<11} {'topology':<13} {'(S,R)':<8} {'inst':<9} {'CS (ms)':>9} {'exact (ms)':>10} "
              f"{'speed-up':>8} {'full':>6} {'proof':>10} {'time (s)':>8} {'nodes':>9}")
    lines = [header, "-" * len(header)]
    for c in cells:
        proof = "optimal" if c["proven"] else f"gap {100 * c['gap']:.1f}%"
        shape = f"({c['S']},{c['R']})"
        lines.append(f"{c['model']:<11} {c['topology']:<13} {shape:<8} {c['instantiation']:<9} "
                     f"{1e3 * c['cs_time_s']:>9.2f} {1e3 * c['exact_time_s']:>10.2f} {c['speedup']:>7.2f}x "
                     f"{c['speedup_full']:>5.2f}x {proof:>10} {c['solve_time_s']:>8.2f} {c['nodes']:>9}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per cell (default 60)")
    parser.add_argument("--models", nargs="+", default=["resnet152", "bert-large"])
    parser.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES), choices=list(TOPOLOGIES))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log.info("stages: forward ops cut into S contiguous chunks of equal compute (CostModel, cluster GPU);"
             " a stand-in until the partitioner's DP is used")
    cells = []
    for model in args.models:
        graph = resolve_model(model)
        for topology in args.topologies:
            for shape in SHAPES:
                cell = run_cell(model, graph, topology, TOPOLOGIES[topology], shape, args.time_limit)
                log.info("%s %s %s: %.2fx, %s, %.2f s", model, topology, shape, cell["speedup"],
                         "optimal" if cell["proven"] else f"gap {cell['gap']:.3g}", cell["solve_time_s"])
                cells.append(cell)
    log.info("\n%s", format_table(cells))
    print(json.dumps({"time_limit_s": args.time_limit, "cells": cells}))


if __name__ == "__main__":
    main()
