"""Check the roofline cost model against the measured PipeDream layer times.

For each profile: Spearman rank correlation of predicted (roofline on the GPU the profile was measured
on, measured times ignored) and measured forward and backward layer times, and the median ratio
predicted/measured; then the two efficiency factors fitted by least squares in log space, per profile
and over all three. Prints a table and ends with one JSON line; ``--json`` prints only the JSON.

    python scripts/check_cost_model.py [--profiles DIR] [--gpu v100] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from tag.cost import CostModel, fit_efficiencies, profile_agreement
from tag.cost.calibrate import measured_samples
from tag.graph.pipedream import load_pipedream

PROFILES = ("vgg16", "resnet50", "gnmt")
DEFAULT_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "pipedream-profiles"


def check(directory: Path, gpu: str | None) -> dict:
    model = CostModel()
    report: dict = {"gpu": gpu, "defaults": {"compute_efficiency": model.compute_efficiency,
                                             "memory_efficiency": model.memory_efficiency},
                    "layers": {}, "spearman": {}, "median_ratio": {}, "fit": {}}
    pooled: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for name in PROFILES:
        graph = load_pipedream(directory / f"{name}.graph.txt")
        device = gpu or graph.meta["measured_on"]
        report["gpu"] = device
        agreement = profile_agreement(graph, cost_model=model, gpu=device)
        report["layers"][name] = graph.meta["layers"]
        report["spearman"][name] = {role: round(a["spearman"], 4) for role, a in agreement.items()}
        report["median_ratio"][name] = {role: round(a["median_ratio"], 4) for role, a in agreement.items()}
        ops = measured_samples(graph)
        sample = (graph.flops[ops], graph.bytes_accessed[ops], graph.measured_time[ops])
        pooled.append(sample)
        report["fit"][name] = _fit_json(fit_efficiencies(*sample, device))
    report["fit"]["all"] = _fit_json(fit_efficiencies(*(np.concatenate(c) for c in zip(*pooled)), report["gpu"]))
    return report


def _fit_json(fit) -> dict:
    return {"compute_efficiency": round(fit.compute_efficiency, 3), "memory_efficiency": round(fit.memory_efficiency, 3),
            "rms_log_error": round(fit.rms_log_error, 3), "samples": fit.samples}


def print_tables(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(caption="pred/meas: median of predicted / measured layer time",
                  title=f"Roofline vs PipeDream measured layer times ({report['gpu']}, "
                        f"efficiencies {report['defaults']['compute_efficiency']} / {report['defaults']['memory_efficiency']})")
    for column in ("model", "layers", "Spearman fwd", "Spearman bwd", "pred/meas fwd", "pred/meas bwd"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name in PROFILES:
        rho, ratio = report["spearman"][name], report["median_ratio"][name]
        table.add_row(name, str(report["layers"][name]), f"{rho['forward']:.3f}", f"{rho['backward']:.3f}",
                      f"{ratio['forward']:.2f}", f"{ratio['backward']:.2f}")
    console.print(table)
    fits = Table(title="Efficiency factors fitted by least squares of ln(predicted / measured)")
    for column in ("profile", "compute", "memory", "rms log error", "samples"):
        fits.add_column(column, justify="left" if column == "profile" else "right")
    for name, fit in report["fit"].items():
        fits.add_row(name, f"{fit['compute_efficiency']:.2f}", f"{fit['memory_efficiency']:.2f}",
                     f"{fit['rms_log_error']:.2f}", str(fit["samples"]))
    console.print(fits)
    overall, defaults = report["fit"]["all"], report["defaults"]
    verdict = all(0.5 <= defaults[k] / overall[k] <= 2.0 for k in ("compute_efficiency", "memory_efficiency"))
    console.print(f"defaults (compute {defaults['compute_efficiency']}, memory {defaults['memory_efficiency']}) are "
                  f"{'within' if verdict else 'NOT within'} a factor 2 of the pooled fit "
                  f"(compute {overall['compute_efficiency']:.2f}, memory {overall['memory_efficiency']:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=DEFAULT_DIR.resolve(), help="folder of the graph.txt files")
    parser.add_argument("--gpu", default=None, help="GPU type to predict on (default: the profile's measured_on)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    report = check(args.profiles, args.gpu)
    if not args.json:
        print_tables(report)
    print(json.dumps(report, separators=(",", ":")))


if __name__ == "__main__":
    main()
