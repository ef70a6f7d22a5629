"""Profile the zoo's train steps on the GPU at hand and hold the roofline against them.

    PYTHONPATH=. python3 scripts/profile_gpu.py --out-dir OUT [--device cuda] [--budget-s 270]
        [--models a,b] [--tiny-only] [--gpu-type h100]

Every op of every tiny zoo model, then of the full models from the smallest up, is timed on the device
(CUDA events, median of 5 after 2 warm-up calls) at a quarter, a half and all of the model's batch, and
TAG's linear model is fitted per op (:mod:`tag.profile.ops`); no model is started once ``--budget-s`` has
passed. Communication between two processes of this host is measured once (:mod:`tag.profile.comm`).
Written to ``--out-dir`` after every model, so that a run cut short keeps what it measured:

- ``profile-<gpu>.json.gz``: the profile (`--profile` of the planning commands; `datasets/profiles/`);
- ``agreement-<gpu>.json``: per op kind over all models (Spearman of the roofline against the measured
  times, median roofline / measured), per model and role, and the roofline's efficiencies fitted to
  the measured times (:mod:`tag.cost.calibrate`).

Prints one line per model, the agreement table, and one JSON line. Needs torch, numpy, networkx, numba,
rich, pyyaml and pymetis (the compiler's import chain), not pulp.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

from tag.cluster.gpus import gpu_type
from tag.errors import TagError
from tag.execute.program import zoo_program
from tag.models import list_models
from tag.profile.cli import device_type_name
from tag.profile.comm import measure_comm
from tag.profile.data import DeviceProfile, Profile, save_profile
from tag.profile.ops import profile_program, single_thread
from tag.profile.report import agreement_by_role, agreement_table, roofline_fit

# Largest last: a full model that starts just inside the budget must not take minutes.
_FULL_ORDER = ("candle-uno", "dlrm", "mmt", "resnet101", "inception-v3", "bert-small", "resnet152", "gpt2",
               "transformer", "vgg19", "bert-large", "bert-36", "bert-48")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpu-type", default=None, help="catalogue type of the device (default: from its name)")
    parser.add_argument("--budget-s", type=float, default=270.0, help="start no model after this many seconds")
    parser.add_argument("--models", default=None, help="comma-separated zoo names (default: all)")
    parser.add_argument("--tiny-only", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-comm", action="store_true")
    return parser.parse_args()


def queue(args: argparse.Namespace) -> list[tuple[str, bool]]:
    names = args.models.split(",") if args.models else [spec.name for spec in list_models()]
    full = [] if args.tiny_only else [n for n in _FULL_ORDER if n in names] + \
        [n for n in names if n not in _FULL_ORDER]
    return [(n, True) for n in names] + [(n, False) for n in full]


def write(out: Path, name: str, device: DeviceProfile, steps: list, gpu, started: float) -> dict:
    """The profile and the agreement so far, both written atomically."""
    save_profile(Profile({name: device}), out / f"profile-{name}.json.gz")
    summary = {"gpu": name, "description": device.description, "torch": device.torch, "timing": device.timing,
               "models": [{"model": times.name, "ops": times.num_ops, "batch_sizes": list(times.batch_sizes),
                           "step_s": float(times.predicted(times.batch_size).sum()),
                           "by_role": agreement_by_role(graph, times, gpu)} for graph, times in steps],
               "by_kind": agreement_table(steps, gpu, top=15), "roofline_fit": device.roofline_fit,
               "comm": {k: {"backend": c.backend, "latency_s": c.latency_s, "bandwidth": c.bandwidth}
                        for k, c in device.comm.items()},
               "seconds": time.perf_counter() - started}
    tmp = out / f".agreement-{name}.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=float))
    tmp.replace(out / f"agreement-{name}.json")
    return summary


def main() -> None:
    args = arguments()
    started = time.perf_counter()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = device_type_name(args.device, args.gpu_type)
    gpu = gpu_type(name)
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    description = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    timing = {"warmup": args.warmup, "repeats": args.repeats, "statistic": "median",
              "timer": "cuda events" if args.device == "cuda" else "perf_counter",
              "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
              "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32)}
    comm = {} if args.no_comm else measure_comm(device=args.device)
    print(f"{name} ({description}), torch {torch.__version__}; comm: "
          + ", ".join(f"{k} {c.latency_s * 1e6:.0f} us + S / {c.bandwidth / 1e9:.2f} GB/s" for k, c in comm.items()),
          flush=True)
    models, steps, summary = {}, [], None
    for model, tiny in queue(args):
        if time.perf_counter() - started > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: stopping before {model}{' (tiny)' if tiny else ''}",
                  flush=True)
            break
        clock = time.perf_counter()
        try:
            program = zoo_program(model, tiny=tiny)
            with single_thread() if args.device == "cpu" else contextlib.nullcontext():
                times = profile_program(program, device=device, warmup=args.warmup, repeats=args.repeats)
        except (TagError, RuntimeError) as error:  # one model failing (out of memory, say) keeps the others
            print(f"{model}{' (tiny)' if tiny else ''}: failed: {type(error).__name__}: {str(error)[:200]}",
                  flush=True)
            torch.cuda.empty_cache() if args.device == "cuda" else None
            continue
        models[times.name] = times
        steps.append((program.graph, times))
        device_profile = DeviceProfile(name, description, args.device, "fp32", torch.get_num_threads(),
                                       torch.__version__, timing, dict(models), comm, roofline_fit(steps, gpu))
        summary = write(out, name, device_profile, steps, gpu, started)
        fit_step = times.predicted(times.batch_size).sum()
        print(f"{times.name}: {times.num_ops} ops at batch {list(times.batch_sizes)}, step {fit_step * 1e3:.2f} ms "
              f"({time.perf_counter() - clock:.1f} s)", flush=True)
        del program
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if summary is None:
        raise SystemExit("no model was profiled")
    print_table(summary)
    print(json.dumps({"gpu": name, "description": description, "models": len(steps),
                      "all": summary["by_kind"][-1], "roofline_fit": summary["roofline_fit"],
                      "seconds": round(time.perf_counter() - started, 1)}, default=float))


def print_table(summary: dict) -> None:
    print(f"\nroofline against measured on {summary['gpu']}, per op kind (all models, each at its batch)")
    print(f"{'op kind':44} {'ops':>6} {'measured':>11} {'roofline':>11} {'Spearman':>9} {'median r/m':>10}")
    for row in summary["by_kind"]:
        rho = "-" if row["spearman"] != row["spearman"] else f"{row['spearman']:.2f}"
        print(f"{row['kind'][:44]:44} {row['ops']:6d} {row['measured_s'] * 1e3:9.2f}ms {row['roofline_s'] * 1e3:9.2f}ms "
              f"{rho:>9} {row['median_ratio']:10.2f}")
    fit = summary["roofline_fit"]
    if fit:
        print(f"calibrated roofline: launch {fit['launch_overhead_s'] * 1e6:.1f} us, compute efficiency "
              f"{fit['compute_efficiency']:.3f}, memory {fit['memory_efficiency']:.3f}, rms log error "
              f"{fit['rms_log_error']:.2f} over {fit['samples']} ops")


if __name__ == "__main__":
    main()
