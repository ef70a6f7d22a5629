"""The roofline calibrated to a profile, held against models the calibration did not see.

    python scripts/check_calibration.py [--profile datasets/profiles/h200.json.gz] [--gpu h200] [--json]

The profile's full models are split in two (every other one, in the file's order); the roofline is
calibrated on the first half (:func:`tag.profile.report.roofline_fit`: the per-op launch floor, then the
two efficiencies under it) and both it and the catalogue's roofline predict every op of the other half
and of the tiny models, against their measured times: rms of ln(predicted / measured), the median ratio,
Spearman, and the ratio of the summed times (a step on one device). The graphs are traced here; each must
match the profile's structure. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np

from tag.cluster.gpus import gpu_type
from tag.cost import CostModel, spearman
from tag.graph.resolve import resolve_model
from tag.profile.data import load_profile
from tag.profile.report import measured_at_reference, roofline_fit


def steps_of(profile, gpu_name: str) -> list[tuple[str, object, object]]:
    device = profile.device(gpu_name)
    steps = []
    for key, times in device.models.items():
        tiny = key.endswith("-tiny")
        graph = resolve_model(key[:-5] if tiny else key, tiny=tiny, batch_size=times.batch_size)
        if device.match(graph) is not times:
            raise SystemExit(f"{key}: the graph traced here is not the profiled step")
        steps.append((key, graph, times))
    return steps


def agreement(cost: CostModel, gpu, steps) -> dict:
    measured = np.concatenate([measured_at_reference(graph, times) for _, graph, times in steps])
    predicted = np.concatenate([cost.op_times(graph, gpu) for _, graph, _ in steps])
    ok = np.isfinite(measured) & (measured > 0) & (predicted > 0)
    log_ratio = np.log(predicted[ok] / measured[ok])
    return {"ops": int(ok.sum()), "rms_log_error": float(np.sqrt((log_ratio ** 2).mean())),
            "median_ratio": float(np.exp(np.median(log_ratio))), "spearman": spearman(predicted[ok], measured[ok]),
            "sum_ratio": float(predicted[ok].sum() / measured[ok].sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="datasets/profiles/h200.json.gz")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    gpu = gpu_type(args.gpu)
    steps = steps_of(load_profile(args.profile), gpu.name)
    full = [s for s in steps if not s[0].endswith("-tiny")]
    fit_on, held_out, tiny = full[::2], full[1::2], [s for s in steps if s[0].endswith("-tiny")]
    fit = roofline_fit([(graph, times) for _, graph, times in fit_on], gpu)
    calibrated = CostModel(compute_efficiency=fit["compute_efficiency"], memory_efficiency=fit["memory_efficiency"])
    calibrated_gpu = dataclasses.replace(gpu, launch_overhead_s=fit["launch_overhead_s"])
    rows = []
    for label, subset in (("held-out full models", held_out), ("tiny models", tiny)):
        rows.append({"models": label, "names": [s[0] for s in subset],
                     "catalogue": agreement(CostModel(), gpu, subset),
                     "calibrated": agreement(calibrated, calibrated_gpu, subset)})
    if not args.json:
        print(f"calibrated on {', '.join(s[0] for s in fit_on)}: launch {fit['launch_overhead_s'] * 1e6:.1f} us, "
              f"compute {fit['compute_efficiency']:.2f}, memory {fit['memory_efficiency']:.2f}")
        print(f"{'ops of':<22}{'roofline':<12}{'ops':>7}{'rms log':>9}{'median':>8}{'Spearman':>10}{'sum':>7}")
        for row in rows:
            for which in ("catalogue", "calibrated"):
                a = row[which]
                print(f"{row['models']:<22}{which:<12}{a['ops']:>7}{a['rms_log_error']:>9.2f}{a['median_ratio']:>8.2f}"
                      f"{a['spearman']:>10.2f}{a['sum_ratio']:>7.2f}")
    print(json.dumps({"benchmark": "calibration", "gpu": gpu.name, "fit_on": [s[0] for s in fit_on], "fit": fit,
                      "rows": rows}))


if __name__ == "__main__":
    main()
