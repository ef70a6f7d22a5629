"""The baseline table of the README: `tag baselines` for the six TAG models on the TAG testbed and cloud.

    python scripts/baselines_table.py                 # markdown table, then one JSON line
    python scripts/baselines_table.py --models vgg19 --clusters tag-testbed

Each cell is the simulated iteration time (group granularity, 60 METIS groups); OOM marks a plan that does
not fit (its time is what it would take with unlimited memory).
"""

from __future__ import annotations

import argparse
import json
import time

from rich.progress import Progress

from tag.baselines import BASELINES, baselines_table, run_baselines
from tag.cluster import resolve_cluster
from tag.graph.resolve import resolve_model
from tag.planner import TAG_CLUSTERS, TAG_MODELS



def cell(row: dict) -> str:
    text = f"{row['iteration_time_s'] * 1e3:.0f} ms"
    return f"{text} (OOM)" if row["oom"] else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TAG_MODELS))
    parser.add_argument("--clusters", nargs="+", default=list(TAG_CLUSTERS))
    parser.add_argument("--num-groups", type=int, default=60)
    args = parser.parse_args()
    names = tuple(BASELINES)
    figures = []
    with Progress(transient=True) as progress:
        task = progress.add_task("baselines", total=len(args.models) * len(args.clusters))
        for cluster_name in args.clusters:
            cluster = resolve_cluster(cluster_name)
            for model in args.models:
                progress.update(task, description=f"{model} on {cluster_name}")
                graph = resolve_model(model)
                t0 = time.perf_counter()
                rows = baselines_table(run_baselines(graph, cluster, num_groups=args.num_groups, names=names))
                figures.append({"model": model, "cluster": cluster_name, "batch_size": graph.batch_size,
                                "seconds": time.perf_counter() - t0,
                                "baselines": {key: {"iteration_time_s": r["iteration_time_s"], "oom": r["oom"]}
                                              for key, r in zip(names, rows)}})
                progress.advance(task)
    header = ["cluster", "model", "batch", *names]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for entry in figures:
        cells = [cell(entry["baselines"][key]) for key in names]
        print(f"| {entry['cluster']} | {entry['model']} | {entry['batch_size']} | " + " | ".join(cells) + " |")
    print(json.dumps({"benchmark": "baselines", "rows": figures}))


if __name__ == "__main__":
    main()
