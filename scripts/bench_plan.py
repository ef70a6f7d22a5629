"""One planner for the user: `tag plan` over every family, end to end, per (model, cluster).

    python scripts/bench_plan.py                                  # the 21 cells below, --time 55
    python scripts/bench_plan.py --cells bert-large:tag-testbed mmt:examples/summit-16.yaml --time 30

Cells: the six TAG models on tag-testbed, tag-cloud and dgx1x4, and MMT, DLRM and CANDLE-Uno on a
Summit-like cluster of 16 V100 (``examples/summit-16.yaml``: 4 nodes of 4, NVLink 50 GB/s, 100 Gb/s
between nodes). Each cell runs the command a user runs, ``tag plan MODEL --cluster C --time T --json``
(the shipped GNN policy drives the placement search), in its own process, and reports each family's
best simulated iteration, the chosen plan, its ratio to the compute bound, the planning time of each
family and the wall time of the whole command (process start to exit: imports, model, policy, every
family). A line per cell as it finishes, then a markdown table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = [sys.executable, "-m", "tag"]
TAG_MODELS = ("inception-v3", "resnet101", "vgg19", "transformer", "bert-small", "bert-large")
TAG_CLUSTERS = ("tag-testbed", "tag-cloud", "dgx1x4")
SUMMIT = "examples/summit-16.yaml"
GRAPH_MODELS = ("mmt", "dlrm", "candle-uno")
FAMILIES = ("placement", "data-parallel", "pipeline", "graph-pipeline")


def default_cells() -> list[tuple[str, str]]:
    return [(m, c) for c in TAG_CLUSTERS for m in TAG_MODELS] + [(m, SUMMIT) for m in GRAPH_MODELS]


def run_cell(model: str, cluster: str, seconds: float) -> dict:
    start = time.perf_counter()
    done = subprocess.run([*TAG, "plan", model, "--cluster", cluster, "--time", str(seconds), "--json"],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"model": model, "cluster": cluster, "wall_s": wall, "error": done.stderr.strip()[-300:]}
    payload = json.loads(done.stdout)
    return {"model": model, "cluster": payload["cluster"], "devices": payload["devices"], "wall_s": wall,
            "planning_time_s": payload["planning_time_s"], "bound_s": payload["compute_bound_s"],
            "chosen": payload["family"], "planner": payload["planner"], "shape": payload["shape"],
            "iteration_time_s": payload["iteration_time_s"], "feasible": payload["feasible"],
            "bound_ratio": payload["bound_ratio"], "family_planning_time_s": payload["family_planning_time_s"],
            "families": {row["family"]: {k: row[k] for k in ("planner", "iteration_time_s", "feasible", "shape",
                                                             "bound_ratio")}
                         for row in payload["families"]}}


def cell_text(row: dict, family: str) -> str:
    best = row["families"].get(family)
    if best is None or best["iteration_time_s"] is None:
        return "-"
    return f"{best['iteration_time_s'] * 1e3:.1f}" + ("" if best["feasible"] else " OOM")


def markdown(rows: list[dict]) -> str:
    """The table as docs/benchmarks/families.md and the README publish it (the chosen plan's time is its
    family's column)."""
    lines = ["| model | cluster | placement | data-parallel | pipeline | graph-pipeline | chosen | x bound | wall |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        cluster = Path(row["cluster"]).stem if row["cluster"].endswith((".yaml", ".json")) else row["cluster"]
        if "error" in row:
            lines.append(f"| {row['model']} | {cluster} | error: {row['error'][:80]} | | | | | | |")
            continue
        chosen = f"{row['chosen']}, {row['planner']} ({row['shape']})"
        lines.append(f"| {row['model']} | {cluster} | " + " | ".join(cell_text(row, f) for f in FAMILIES)
                     + f" | {chosen} | {row['bound_ratio']:.2f} | {row['wall_s']:.0f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", metavar="MODEL:CLUSTER", help="cells (default: the 21 above)")
    parser.add_argument("--time", type=float, default=55.0, help="tag plan --time per cell (default 55 s)")
    args = parser.parse_args()
    cells = [tuple(c.split(":", 1)) for c in args.cells] if args.cells else default_cells()
    rows = []
    for model, cluster in cells:  # one line per cell as it finishes: a full run takes about 20 minutes
        row = run_cell(model, cluster, args.time)
        rows.append(row)
        if "error" in row:
            print(f"{model} on {cluster}: error after {row['wall_s']:.0f} s: {row['error']}", flush=True)
            continue
        times = ", ".join(f"{f} {s:.1f} s" for f, s in row["family_planning_time_s"].items())
        print(f"{model} on {row['cluster']}: {row['chosen']} {row['planner']} ({row['shape']}) "
              f"{row['iteration_time_s'] * 1e3:.1f} ms, {row['bound_ratio']:.2f}x the bound; wall {row['wall_s']:.0f} s "
              f"({times})", flush=True)
    print()
    print(markdown(rows))
    print(json.dumps({"bench": "plan", "time_s": args.time, "rows": rows}))


if __name__ == "__main__":
    main()
