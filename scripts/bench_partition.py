"""Time Parmesan's partitioning on BERT-Large: the DP over downsets at K hyper-ops, and its pieces.

    python scripts/bench_partition.py                    # BERT-Large, S = 16, K = 16 … 64, alpha 0.01 / 1 / 100
    python scripts/bench_partition.py --model gpt2 --stages 8 --ks 24 48

For each (K, α): operator clustering to K hyper-ops, the DP (downset enumeration, the [D, D] stage tables
of eq. (3) and the kernel of eq. (13)), and the iterative refinement, each the best of ``--repeat`` runs;
then PipeDream's contiguous DP over the op-level topological order for comparison. Micro-batch: the
graph's batch / (M · R) with M = S, R = 1, on one V100-16GB, boundary tensors priced at 10 GB/s.
Single process. Prints a table and ends with one JSON line (the headline is K = 48).
"""

from __future__ import annotations

import argparse
import json
import time

from tag.cluster import gpu_type
from tag.exact.downsets import DEFAULT_DOWNSET_LIMIT, DownsetLimitError
from tag.exact.partition import partition_parmesan, partition_pipedream
from tag.exact.stage_graph import ForwardGraph
from tag.graph.resolve import resolve_model


def best_of(repeat: int, run):
    results = [run() for _ in range(repeat)]
    return min(results, key=lambda r: r.info.get("dp_s", 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-large")
    parser.add_argument("--stages", type=int, default=16)
    parser.add_argument("--ks", type=int, nargs="+", default=[16, 24, 32, 48, 64])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.01, 1.0, 100.0])
    parser.add_argument("--bandwidth", type=float, default=10e9, help="bytes/s for boundary tensors")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--downset-limit", type=int, default=DEFAULT_DOWNSET_LIMIT,
                        help="K is lowered until the hyper-op graph has at most this many downsets")
    args = parser.parse_args()

    graph = resolve_model(args.model)
    gpu = gpu_type("v100-16gb")
    start = time.perf_counter()
    fg = ForwardGraph.from_graph(graph, [gpu])
    view_s = time.perf_counter() - start
    common = dict(stages=args.stages, micro_batches=args.stages, capacity=gpu.memory_bytes, bandwidth=args.bandwidth)
    print(f"{args.model}: {graph.num_ops} ops, {fg.num_nodes} forward ops, forward view built in {view_s:.3f} s; "
          f"S = {args.stages}, M = {args.stages}, R = 1")
    print(f"{'K':>4} {'alpha':>6} {'downsets':>8} {'cluster s':>10} {'DP s':>8} {'refine s':>9} "
          f"{'DP max ms':>10} {'final ms':>9} {'moves':>5}")
    rows = []
    for k in args.ks:
        for alpha in args.alphas:
            try:
                result = best_of(args.repeat, lambda: partition_parmesan(fg, **common, num_hyper_ops=k, alpha=alpha,
                                                                         downset_limit=args.downset_limit))
            except DownsetLimitError as error:  # K cannot go below S: this clustering is too branchy
                rows.append({"K": k, "alpha": alpha, "error": str(error)})
                print(f"{k:>4} {alpha:>6g} {'> ' + str(args.downset_limit):>8}  over the downset limit, even with K lowered to S")
                continue
            info = result.info
            rows.append({"K": k, "alpha": alpha, "hyper_ops": info["hyper_ops"], "downsets": info["downsets"],
                         "clustering_s": info["clustering_s"], "dp_s": info["dp_s"],
                         "refine_s": info.get("refine_s", 0.0), "dp_max_stage_s": result.dp_cost,
                         "max_stage_s": result.max_stage_time, "moves": info["refine_moves"]})
            print(f"{info['hyper_ops']:>4} {alpha:>6g} {info['downsets']:>8} {info['clustering_s']:>10.4f} "
                  f"{info['dp_s']:>8.4f} {info.get('refine_s', 0.0):>9.4f} {result.dp_cost * 1e3:>10.3f} "
                  f"{result.max_stage_time * 1e3:>9.3f} {info['refine_moves']:>5}")
    pipedream = best_of(args.repeat, lambda: partition_pipedream(fg, **common))
    print(f"PipeDream contiguous DP over {fg.num_nodes} ops: {pipedream.info['dp_s']:.4f} s, "
          f"max stage {pipedream.max_stage_time * 1e3:.3f} ms")
    done = [r for r in rows if "error" not in r]
    headline = [r for r in done if r["K"] == 48] or done
    worst = max(headline, key=lambda r: r["dp_s"])
    print(json.dumps({"model": args.model, "stages": args.stages, "forward_ops": fg.num_nodes,
                      "dp_s_at_k48_worst_alpha": worst["dp_s"], "within_1s": worst["dp_s"] < 1.0,
                      "pipedream_dp_s": pipedream.info["dp_s"], "pipedream_max_stage_s": pipedream.max_stage_time,
                      "rows": rows}))


if __name__ == "__main__":
    main()
