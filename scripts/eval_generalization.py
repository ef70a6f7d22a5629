"""Does one trained policy plan well for clusters and models it never saw? (TAG §5.7, §5.8; issue 6)

(a) TAG Table 7: on N random topologies (``tag_random`` seeds from tag.training.EVAL_SEED_START, disjoint
    from every training and validation seed), per TAG model, the mean number of MCTS iterations until a
    plan beats DP-NCCL: pure MCTS (uniform priors) against GNN-guided MCTS. A search that does not beat
    DP-NCCL within the budget counts as budget + 1 (and the table says how many did not). Where neither
    search beats DP-NCCL, a longer pure MCTS (``--verify-budget``) asks whether any plan in the search space
    does; where none is found, the topology has no iteration count to compare, and the "beatable" columns
    average over the other topologies only (both counts are printed).
(b) TAG Table 8: per held-out model, a policy trained without it (``--holdout MODEL=POLICY``, repeatable)
    against the full policy: that model's speed-up over DP-NCCL after a full search budget, on the same
    unseen topologies. Without hold-out policies this part reports the full policy's speed-ups only.
(c) Presets never used in training (TAG cloud, 4×DGX-1, a 2D mesh): iterations to beat DP-NCCL and the
    speed-up after the budget, pure against GNN-guided.
(f) By topology family (tag.cluster.families; the held-out families marked): per family, pooled over
    ``--family-models`` × ``--family-topologies`` unseen seeds, the iterations to beat DP-NCCL over the
    beatable instances and the mean speed-up after the budget, pure against GNN-guided.

Searches use the training config's grouping and search settings (``--config``). Results are cached in
``--cache`` (JSON), so the script can run in pieces (e.g. ``--methods uniform`` before a policy exists).
Prints readable tables, then one JSON line (``--json``: only the JSON line).

    .venv/bin/python scripts/eval_generalization.py --policy checkpoints/tag-policy.pt --topologies 100
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tag._atomic import atomic_write_text  # noqa: E402
from tag.cluster.families import FAMILIES, HELD_OUT  # noqa: E402
from tag.planner import TAG_MODELS  # noqa: E402
from tag.training import EVAL_SEED_START, Instance, Outcome, SelfPlayPool, load_config  # noqa: E402

# Cached outcomes are keyed by this too: bump it when the simulator's figures change (v2: weight reads are
# charged at every batch share; a "beat" must exceed tag.search.BEAT_RTOL).
CACHE_VERSION = 2
PRESETS = ("tag-cloud", "dgx1x4", "mesh2d:4x4")  # never used in training: TAG cloud, 4×DGX-1, a 2D mesh
METHODS = ("uniform", "gnn")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default=str(ROOT / "checkpoints" / "tag-policy.pt"), help="the full policy")
    p.add_argument("--config", default=str(ROOT / "training" / "configs" / "tag.toml"),
                   help="training config whose grouping and search settings the searches use")
    p.add_argument("--topologies", type=int, default=100, help="random topologies for (a) and (b)")
    p.add_argument("--budget", type=int, default=200, help="MCTS iterations per search")
    p.add_argument("--verify-budget", type=int, default=1000,
                   help="(a) pure-MCTS iterations that decide whether a topology neither search beat is beatable "
                        "(0: skip)")
    p.add_argument("--models", default=",".join(TAG_MODELS), help="comma-separated zoo models")
    p.add_argument("--parts", default="a,b,c,f", help="which of a, b, c, f to run")
    p.add_argument("--methods", default="uniform,gnn", help="uniform (pure MCTS) and/or gnn")
    p.add_argument("--presets", default=",".join(PRESETS), help="clusters of part (c)")
    p.add_argument("--families", default=",".join(FAMILIES), help="topology families of part (f)")
    p.add_argument("--family-topologies", type=int, default=4, help="(f) unseen seeds per family and model")
    p.add_argument("--family-models", default="resnet101,transformer,bert-large",
                   help="(f) comma-separated zoo models")
    p.add_argument("--holdout", action="append", default=[], metavar="MODEL=POLICY",
                   help="(b) a policy trained with MODEL held out (repeatable, one per model)")
    p.add_argument("--b-topologies", type=int, default=20, help="topologies of part (b) (full-budget searches)")
    p.add_argument("--uniform-mix", type=float, default=0.0,
                   help="GNN priors mixed with this share of uniform priors (tag.training.mix_uniform)")
    p.add_argument("--workers", type=int, default=2, help="search processes")
    p.add_argument("--cache", default=str(ROOT / "runs" / "eval_generalization.json"), help="result cache")
    p.add_argument("--json", action="store_true", help="print only the final JSON line")
    return p.parse_args(argv)


def parse_holdouts(specs: list[str]) -> dict[str, str]:
    """``MODEL=POLICY`` pairs of ``--holdout`` as {model: policy path}; a malformed or repeated model is an error."""
    out: dict[str, str] = {}
    for spec in specs:
        model, sep, path = spec.partition("=")
        if not sep or not model or not path:
            raise SystemExit(f"eval_generalization: --holdout wants MODEL=POLICY, got {spec!r}")
        if model in out:
            raise SystemExit(f"eval_generalization: --holdout names {model} twice")
        out[model] = path
    return out


def _label_path(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


class Runner:
    """Searches through a process pool, with their outcomes cached on disk by (what, method, instance)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from tag.policy import load_policy

        torch.set_num_threads(1)
        self.config = load_config(args.config).replace(workers=args.workers)
        self.budget = args.budget
        self.uniform_mix = args.uniform_mix
        self.cache_path = Path(args.cache)
        self.cache: dict[str, Any] = json.loads(self.cache_path.read_text()) if self.cache_path.is_file() else {}
        self.policies: dict[str, Any] = {"uniform": (None, "uniform")}
        self.holdouts = parse_holdouts(args.holdout)
        paths = {"gnn": args.policy, **{f"holdout:{m}": path for m, path in self.holdouts.items()}}
        for method, path in paths.items():
            if path and Path(path).is_file():
                loaded = load_policy(path)
                mix = f"+mix{args.uniform_mix:g}" if args.uniform_mix > 0 else ""
                # The folder is part of the label (a cache key): hold-out runs all write a policy.pt.
                self.policies[method] = (loaded.model.eval(), f"{_label_path(path)}@{loaded.step}{mix}")
            elif method != "gnn":
                raise SystemExit(f"eval_generalization: no hold-out policy file at {path}")
        self.pool = SelfPlayPool(args.workers)
        self.quiet = args.json

    def run(self, method: str, instances: list[Instance], *, stop_on_beat: bool, budget: int | None = None
            ) -> list[dict[str, Any]]:
        model, label = self.policies[method]
        budget = self.budget if budget is None else budget
        keys = [f"v{CACHE_VERSION}|{label}|{budget}|{stop_on_beat}|{self.config.num_groups}|{i.model}|"
                f"{i.topology_seed}|{i.cluster}" + ("" if i.family == "tag-random" else f"|{i.family}")
                for i in instances]
        todo = [(k, i) for k, i in zip(keys, instances) if k not in self.cache]
        for done, outcome in enumerate(self.pool.search(self.config, model, [i for _, i in todo], version=hash(label),
                                                        iterations=budget, seed=0, stop_on_beat=stop_on_beat,
                                                        uniform_mix=0.0 if model is None else self.uniform_mix)):
            self.cache[todo[done][0]] = _row(outcome)
            if done % 10 == 9 or done == len(todo) - 1:
                self.save()
                if not self.quiet:
                    print(f"  {method}: {done + 1}/{len(todo)} searches", file=sys.stderr, flush=True)
        return [self.cache[k] for k in keys]

    def save(self) -> None:
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.cache_path, json.dumps(self.cache))

    def close(self) -> None:
        self.pool.close()


def _row(outcome: Outcome) -> dict[str, Any]:
    return {"first_beat": outcome.first_beat_iteration, "speedup": outcome.best_speedup,
            "iterations": outcome.iterations, "seconds": outcome.seconds, "reference": outcome.reference}


def beat_stats(rows: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Mean iterations to beat DP-NCCL (a miss counts as budget + 1), misses, and the share within 2."""
    valid = [r for r in rows if r["reference"] == "DP-NCCL"]  # DP-NCCL must fit to be beaten
    its = [r["first_beat"] if r["first_beat"] is not None else budget + 1 for r in valid]
    return {"mean": float(np.mean(its)) if its else None, "median": float(np.median(its)) if its else None,
            "misses": sum(r["first_beat"] is None for r in valid), "within_2": sum(i <= 2 for i in its),
            "n": len(valid), "dp_oom": len(rows) - len(valid)}


def part_a(runner: Runner, models: list[str], topologies: int, methods: list[str], verify_budget: int
           ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        instances = [Instance(model, EVAL_SEED_START + k) for k in range(topologies)]
        rows = {m: runner.run(m, instances, stop_on_beat=True) for m in methods if m in runner.policies}
        out[model] = {m: beat_stats(r, runner.budget) for m, r in rows.items()}
        if "uniform" in rows and "gnn" in rows:
            out[model]["paired"] = paired_stats(rows["uniform"], rows["gnn"])
            if verify_budget > runner.budget:
                out[model]["beatable"] = beatable_stats(runner, instances, rows, verify_budget)
    return out


def beatable_stats(runner: Runner, instances: list[Instance], rows: dict[str, list[dict[str, Any]]],
                   verify_budget: int) -> dict[str, Any]:
    """Both searches' iterations to beat DP-NCCL over the topologies where some plan beats it: one of the
    two searches did, or a pure MCTS of ``verify_budget`` iterations did. The rest have no count to compare."""
    pure, gnn = rows["uniform"], rows["gnn"]
    doubt = [k for k, (p, g) in enumerate(zip(pure, gnn))
             if p["reference"] == "DP-NCCL" and p["first_beat"] is None and g["first_beat"] is None]
    verified = runner.run("uniform", [instances[k] for k in doubt], stop_on_beat=True, budget=verify_budget)
    unbeaten = {k for k, row in zip(doubt, verified) if row["first_beat"] is None}
    keep = [k for k in range(len(instances)) if k not in unbeaten]
    return {"verify_budget": verify_budget, "doubtful": len(doubt), "unbeaten": len(unbeaten),
            "uniform": beat_stats([pure[k] for k in keep], runner.budget),
            "gnn": beat_stats([gnn[k] for k in keep], runner.budget)}


def paired_stats(pure: list[dict[str, Any]], gnn: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean iterations over the topologies where both searches beat DP-NCCL within the budget."""
    both = [(p["first_beat"], g["first_beat"]) for p, g in zip(pure, gnn)
            if p["first_beat"] is not None and g["first_beat"] is not None]
    if not both:
        return {"n": 0, "pure": None, "gnn": None}
    return {"n": len(both), "pure": float(np.mean([p for p, _ in both])), "gnn": float(np.mean([g for _, g in both]))}


def part_b(runner: Runner, models: list[str], topologies: int) -> dict[str, Any]:
    """Per model: the mean speed-up over DP-NCCL after the full budget and the iterations to beat it, for
    pure MCTS, the full policy and (where given) the policy trained with that model held out."""
    per_model: dict[str, Any] = {}
    for model in models:
        instances = [Instance(model, EVAL_SEED_START + k) for k in range(topologies)]
        row: dict[str, Any] = {}
        for method, key in (("uniform", "uniform"), ("gnn", "gnn"), (f"holdout:{model}", "holdout")):
            if method in runner.policies:
                rows = runner.run(method, instances, stop_on_beat=False)
                row[key] = float(np.mean([r["speedup"] for r in rows]))
                row[f"{key}_iterations_to_beat"] = beat_stats(runner.run(method, instances, stop_on_beat=True),
                                                              runner.budget)
        if "holdout" in row and "gnn" in row:
            row["holdout_over_full"] = row["holdout"] / row["gnn"]
            row["holdout_policy"] = runner.policies[f"holdout:{model}"][1]
        per_model[model] = row
    out: dict[str, Any] = {"topologies": topologies, "policy": runner.policies.get("gnn", (None, None))[1],
                           "models": per_model}
    ratios = [r["holdout_over_full"] for r in per_model.values() if "holdout_over_full" in r]
    if ratios:
        out["min_holdout_over_full"] = min(ratios)
        out["mean_holdout_over_full"] = float(np.mean(ratios))
    return out


def part_c(runner: Runner, models: list[str], presets: list[str], methods: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for preset in presets:
        instances = [Instance(model, 0, preset) for model in models]
        out[preset] = {}
        for method in methods:
            if method not in runner.policies:
                continue
            beat = runner.run(method, instances, stop_on_beat=True)
            full = runner.run(method, instances, stop_on_beat=False)
            out[preset][method] = {"beat": beat_stats(beat, runner.budget),
                                   "first_beat": {m: r["first_beat"] for m, r in zip(models, beat)},
                                   "speedup": {m: r["speedup"] for m, r in zip(models, full)}}
    return out


def part_f(runner: Runner, models: list[str], families: list[str], topologies: int, methods: list[str],
           verify_budget: int) -> dict[str, Any]:
    """Per topology family (tag.cluster.families), pooled over ``models`` x ``topologies`` unseen seeds: the
    iterations to beat DP-NCCL of each method over the beatable instances, and the mean speed-up after the
    full budget. Held-out families (never drawn in training) are marked."""
    out: dict[str, Any] = {}
    for family in families:
        instances = [Instance(model, EVAL_SEED_START + k, family=family)
                     for model in models for k in range(topologies)]
        beat = {m: runner.run(m, instances, stop_on_beat=True) for m in methods if m in runner.policies}
        full = {m: runner.run(m, instances, stop_on_beat=False) for m in methods if m in runner.policies}
        row: dict[str, Any] = {"held_out": family in HELD_OUT, "instances": len(instances),
                               "speedup": {m: float(np.mean([r["speedup"] for r in rows])) for m, rows in full.items()},
                               "beat": {m: beat_stats(rows, runner.budget) for m, rows in beat.items()}}
        if "uniform" in beat and "gnn" in beat and verify_budget > runner.budget:
            row["beatable"] = beatable_stats(runner, instances, beat, verify_budget)
        out[family] = row
    return out


def family_summary(rows: dict[str, Any]) -> dict[str, Any]:
    """The issue's figures over families, on the beatable instances: pure / GNN iterations to beat DP-NCCL as
    part (a) takes it (the mean over families of pure MCTS's means over the mean of the GNN's) and as the
    mean of the per-family ratios; and the worst GNN / pure final speed-up of any family."""
    means, ratios, worst = [], [], None
    for row in rows.values():
        beatable = row.get("beatable")
        if beatable and beatable["gnn"]["mean"]:
            means.append((beatable["uniform"]["mean"], beatable["gnn"]["mean"]))
            ratios.append(means[-1][0] / means[-1][1])
        if "uniform" in row["speedup"] and "gnn" in row["speedup"]:
            ratio = row["speedup"]["gnn"] / row["speedup"]["uniform"]
            worst = ratio if worst is None else min(worst, ratio)
    return {"iterations_ratio": float(np.mean([u for u, _ in means]) / np.mean([g for _, g in means])) if means else None,
            "mean_family_iterations_ratio": float(np.mean(ratios)) if ratios else None,
            "worst_speedup_ratio": worst}


def print_families(result: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    budget = result["budget"]
    table = Table(title=f"(f) by topology family ({result['f_topologies']} unseen seeds x {len(result['f_models'])} "
                        f"models each; * held out of training): iterations to beat DP-NCCL over the beatable "
                        f"instances, speed-up after {budget}")
    for column in ("family", "beatable", "pure it.", "GNN it.", "pure / GNN", "pure speed-up", "GNN speed-up"):
        table.add_column(column, justify="right")
    for family, row in result["f"].items():
        beatable = row.get("beatable")
        pure, gnn = (beatable["uniform"], beatable["gnn"]) if beatable else (None, None)
        ratio = pure["mean"] / gnn["mean"] if pure and gnn and gnn["mean"] else None
        table.add_row(family + ("*" if row["held_out"] else ""), _f(pure, "n"), _f(pure, "mean"), _f(gnn, "mean"),
                      f"{ratio:.2f}x" if ratio else "-", _x(row["speedup"].get("uniform")),
                      _x(row["speedup"].get("gnn")))
    console.print(table)
    summary = result["f_summary"]
    if summary["iterations_ratio"] is not None:
        console.print(f"pure / GNN iterations to beat DP-NCCL, over families: {summary['iterations_ratio']:.2f}x "
                      f"(mean of the family ratios {summary['mean_family_iterations_ratio']:.2f}x); worst GNN / pure "
                      f"final speed-up of a family: {summary['worst_speedup_ratio']:.3f}")


def print_tables(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=max(Console().width, 140))
    budget = result["budget"]
    if "f" in result:
        print_families(result, console)
    if "a" in result:
        table = Table(title=f"(a) TAG Table 7: MCTS iterations until a plan beats DP-NCCL, {result['topologies']} "
                            f"unseen random topologies, budget {budget} (a miss counts as {budget + 1})")
        for column in ("model", "pure MCTS mean", "GNN mean", "pure / GNN", "pure median", "GNN median",
                       "pure misses", "GNN misses", "pure ≤2 it.", "GNN ≤2 it.", "n", "both found"):
            table.add_column(column, justify="right")
        for model, row in result["a"].items():
            pure, gnn = row.get("uniform"), row.get("gnn")
            cells = [model]
            ratio = pure["mean"] / gnn["mean"] if pure and gnn and gnn["mean"] else None
            cells += [_f(pure, "mean"), _f(gnn, "mean"), f"{ratio:.2f}x" if ratio else "-", _f(pure, "median"),
                      _f(gnn, "median"), _f(pure, "misses"), _f(gnn, "misses"), _f(pure, "within_2"),
                      _f(gnn, "within_2"), _f(pure or gnn, "n"), _paired(row.get("paired"))]
            table.add_row(*cells)
        console.print(table)
        rows = {model: row["beatable"] for model, row in result["a"].items() if "beatable" in row}
        if rows:
            verify = next(iter(rows.values()))["verify_budget"]
            table = Table(title=f"(a) over the beatable topologies only: those where either search, or a pure MCTS "
                                f"of {verify} iterations, found a plan faster than DP-NCCL")
            for column in ("model", "beatable", "neither search beat", "none found", "pure MCTS mean", "GNN mean",
                           "pure / GNN", "pure misses", "GNN misses"):
                table.add_column(column, justify="right")
            for model, row in rows.items():
                pure, gnn = row["uniform"], row["gnn"]
                ratio = pure["mean"] / gnn["mean"] if gnn["mean"] else None
                table.add_row(model, str(pure["n"]), str(row["doubtful"]), str(row["unbeaten"]), _f(pure, "mean"),
                              _f(gnn, "mean"), f"{ratio:.2f}x" if ratio else "-", _f(pure, "misses"),
                              _f(gnn, "misses"))
            console.print(table)
    if "b" in result:
        b = result["b"]
        table = Table(title=f"(b) TAG Table 8: each model held out of training, {b['topologies']} unseen random "
                            f"topologies, mean speed-up over DP-NCCL after {budget} iterations (full policy "
                            f"{b['policy']})")
        for column in ("model", "pure MCTS", "full policy", "held out", "held out / full", "it. to beat: pure",
                       "full", "held out", "hold-out policy"):
            table.add_column(column, justify="right")
        for model, row in b["models"].items():
            ratio = row.get("holdout_over_full")
            table.add_row(model, _x(row.get("uniform")), _x(row.get("gnn")), _x(row.get("holdout")),
                          f"{100 * ratio:.1f}%" if ratio is not None else "-",
                          *(_f(row.get(f"{k}_iterations_to_beat"), "mean") for k in ("uniform", "gnn", "holdout")),
                          row.get("holdout_policy", "-"))
        console.print(table)
    if "c" in result:
        table = Table(title=f"(c) presets never used in training: iterations to beat DP-NCCL / speed-up after {budget}")
        table.add_column("cluster")
        table.add_column("model")
        for column in ("pure it.", "GNN it.", "pure speed-up", "GNN speed-up"):
            table.add_column(column, justify="right")
        for preset, row in result["c"].items():
            pure, gnn = row.get("uniform", {}), row.get("gnn", {})
            for model in (pure or gnn).get("speedup", {}):
                table.add_row(preset, model, _it(pure, model), _it(gnn, model), _sp(pure, model), _sp(gnn, model))
        console.print(table)


def _f(row: dict | None, key: str) -> str:
    if not row or row.get(key) is None:
        return "-"
    value = row[key]
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _paired(row: dict | None) -> str:
    if not row or not row["n"]:
        return "-"
    return f"{row['pure']:.1f}/{row['gnn']:.1f} ({row['pure'] / row['gnn']:.1f}x, n={row['n']})"


def _it(row: dict, model: str) -> str:
    if not row:
        return "-"
    value = row["first_beat"].get(model)
    return "miss" if value is None else str(value)


def _sp(row: dict, model: str) -> str:
    return f"{row['speedup'][model]:.3f}" if row else "-"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    methods = [m for m in args.methods.split(",") if m]
    parts = set(args.parts.split(","))
    runner = Runner(args)
    result: dict[str, Any] = {"budget": args.budget, "topologies": args.topologies,
                              "num_groups": runner.config.num_groups,
                              "policy": runner.policies.get("gnn", (None, None))[1],
                              "uniform_mix": args.uniform_mix,
                              "topology_seeds": [EVAL_SEED_START, EVAL_SEED_START + args.topologies]}
    try:
        if "a" in parts:
            result["a"] = part_a(runner, models, args.topologies, methods, args.verify_budget)
            for key, rows in (("a_overall_ratio", result["a"].values()),
                              ("a_beatable_ratio", [r["beatable"] for r in result["a"].values() if "beatable" in r])):
                means = [(r["uniform"]["mean"], r["gnn"]["mean"]) for r in rows
                         if "uniform" in r and "gnn" in r and r["gnn"]["mean"]]
                if means:  # the ratio of the per-model means, averaged over the models
                    result[key] = float(np.mean([u for u, _ in means]) / np.mean([g for _, g in means]))
            paired = [r["paired"] for r in result["a"].values() if r.get("paired", {}).get("n")]
            if paired:  # over every (model, topology) where both searches beat DP-NCCL within the budget
                result["a_overall_paired_ratio"] = float(sum(p["pure"] * p["n"] for p in paired)
                                                         / sum(p["gnn"] * p["n"] for p in paired))
        if "b" in parts:
            result["b"] = part_b(runner, models, args.b_topologies)
        if "c" in parts:
            result["c"] = part_c(runner, models, [p for p in args.presets.split(",") if p], methods)
        if "f" in parts:
            families = [f for f in args.families.split(",") if f]
            unknown = [f for f in families if f not in FAMILIES]
            if unknown:
                raise SystemExit(f"eval_generalization: unknown topology family {unknown[0]!r}")
            f_models = [m for m in args.family_models.split(",") if m]
            result.update(f_topologies=args.family_topologies, f_models=f_models)
            result["f"] = part_f(runner, f_models, families, args.family_topologies, methods, args.verify_budget)
            result["f_summary"] = family_summary(result["f"])
    finally:
        runner.close()
    if not args.json:
        print_tables(result)
    print(json.dumps(result, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
