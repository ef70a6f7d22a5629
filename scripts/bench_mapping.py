"""Parmesan Table III's shape: speed-up of the exact mapping over CS map on 64-device topologies.

For each model, topology and (S, R) ∈ {(4, 16), (8, 8), (16, 4)}: cut the model into S stages with
Parmesan's partitioner (operator clustering + DP over downsets + refinement, tag.exact.partition_parmesan,
boundary tensors priced at the topology's median bandwidth), solve the mapping exactly (Parmesan
Algorithms 1–2, instantiation chosen by the all-reduce : p2p ratio) and report the max stage time of CS
map over the exact mapping's, both under that instantiation and in seconds per iteration (M micro-
batches, M = min(S, batch / R)), whether the exact mapping is proven optimal (else its gap), and the
solve time. A readable table goes to stderr, one JSON line of the figures to stdout.

    .venv/bin/python scripts/bench_mapping.py [--time-limit 60] [--models resnet152 bert-large]
        [--topologies "2d mesh" ...] [--shapes 8,8 ...]

The last three filters pick cells; e.g. one cell: ``--models resnet152 --topologies "2d torus" --shapes 16,4``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time

from tag.cluster import resolve_cluster
from tag.exact import ALPHAS, DownsetLimitError, ForwardGraph, build_stage_graph, partition_parmesan
from tag.exact.heuristics import cs_map
from tag.exact.mapping import MappingProblem, max_stage_time, solve_mapping
from tag.exact.pipeline import reference_bandwidth
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
# ResNet's residual blocks multiply downsets: K is lowered until the hyper-op graph has at most this many.
DOWNSET_LIMIT = 1 << 12


@functools.lru_cache(maxsize=None)
def forward_view(model: str, gpu: str) -> ForwardGraph:
    return ForwardGraph.from_graph(resolve_model(model), [gpu])


@functools.lru_cache(maxsize=None)
def parmesan_stages(model: str, gpu: str, num_stages: int, replicas: int, bandwidth: float):
    """The StageGraph of Parmesan's partition of ``model`` into S stages of R replicas each: the best over
    the clustering weights α whose hyper-op graph stays within DOWNSET_LIMIT downsets."""
    fg = forward_view(model, gpu)
    micro_batches = max(1, min(num_stages, fg.batch_size // replicas))
    parts = []
    for alpha in ALPHAS:
        try:
            parts.append(partition_parmesan(fg, stages=num_stages, replicas=replicas, micro_batches=micro_batches,
                                            bandwidth=bandwidth, alpha=alpha, downset_limit=DOWNSET_LIMIT))
        except DownsetLimitError as error:
            log.info("%s S=%d alpha=%g: %s", model, num_stages, alpha, error)
    if not parts:
        raise SystemExit(f"{model}: no clustering weight gives at most {DOWNSET_LIMIT} downsets at S={num_stages}")
    best = min(parts, key=lambda part: part.max_stage_time)
    return build_stage_graph(fg, best.forward_stage, replicas=replicas, micro_batches=micro_batches)


def run_cell(model: str, topology: str, address: str, shape: tuple[int, int], time_limit: float) -> dict:
    cluster = resolve_cluster(address)
    num_stages, replicas = shape
    start = time.perf_counter()
    stages = parmesan_stages(model, cluster.types[0].name, num_stages, replicas,
                             reference_bandwidth(cluster, range(cluster.num_devices)))
    partition_s = time.perf_counter() - start
    problem = MappingProblem.from_stage_graph(stages, replicas, cluster)
    result = solve_mapping(problem, time_limit=time_limit)
    mode = result.instantiation
    cs = cs_map(problem)
    cs_time = max_stage_time(problem, cs, mode)
    return {
        "model": model, "topology": topology, "S": num_stages, "R": replicas, "M": stages.micro_batches,
        "instantiation": mode, "partition_s": partition_s,
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
    parser.add_argument("--shapes", nargs="+", default=[f"{s},{r}" for s, r in SHAPES],
                        choices=[f"{s},{r}" for s, r in SHAPES], help="(S, R) pairs as S,R")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    cells = []
    for model in args.models:
        for topology in args.topologies:
            for shape in (tuple(int(n) for n in text.split(",")) for text in args.shapes):
                cell = run_cell(model, topology, TOPOLOGIES[topology], shape, args.time_limit)
                log.info("%s %s %s: %.2fx, %s, %.2f s", model, topology, shape, cell["speedup"],
                         "optimal" if cell["proven"] else f"gap {cell['gap']:.3g}", cell["solve_time_s"])
                cells.append(cell)
    log.info("\n%s", format_table(cells))
    proven = sum(c["proven"] for c in cells)
    log.info("%d of %d cells proven optimal; slowest solve %.2f s", proven, len(cells),
             max(c["solve_time_s"] for c in cells))
    print(json.dumps({"time_limit_s": args.time_limit, "proven": proven, "cells": cells}))


if __name__ == "__main__":
    main()
