#!/usr/bin/python3
"""The same-bits path against today's, and both against PyTorch DDP.

lockstep with comm.summation = exact (the default: the same bits on any
world size) and with comm.summation = float (today's path: float sums in
the all-reduce's order), and PyTorch DDP with glibc malloc's default
thresholds and with them raised (MALLOC_MMAP_THRESHOLD_ = 32 MiB,
MALLOC_TRIM_THRESHOLD_ = 1 GiB, what lockstep's `malloc` decision sets by
mallopt), on compare_ddp.py's models (synthetic data, batch 64 per rank)
and the scripted resnet18 (scripted_resnet.py: batch 32 per rank), 2
ranks, Gloo, one thread per rank. Repetitions interleaved (every variant
of every model once per repetition); median and range. Also the bytes
each rank hands to the gradient all-reduce per step, and the summation's
accuracy against an fp64 sum (tests/bench/summation_error, on 1, 2 and 4
ranks). Prints a table to stderr, JSON to stdout.
Usage: tests/bench/summation.py BUILD_DIR [repetitions]
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_ddp  # noqa: E402
import scripted_resnet  # noqa: E402

RAISED = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
DEFAULT_MALLOC = {k: v for k, v in compare_ddp.ENV.items() if k not in RAISED}
VARIANTS = ("exact", "float", "ddp_default_malloc", "ddp_raised_thresholds")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(compare_ddp.SOURCE, "build")
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    models = ("mlp", "cnn", "deep_mlp", "resnet18")
    ms = {m: {v: [] for v in VARIANTS} for m in models}
    ratios = {m: {"exact_over_float": [], "exact_over_ddp_raised": [], "exact_over_ddp_default": []} for m in models}
    wire = {m: {} for m in models}
    with tempfile.TemporaryDirectory() as folder:
        scripted_resnet.prepare_folder(folder)
        for rep in range(repetitions):
            for model in models:
                step = {}
                for summation in ("exact", "float"):
                    setting = (f"comm.summation={summation}",)
                    if model == "resnet18":
                        seconds, metrics = scripted_resnet.lockstep(build, folder, extra=setting, metrics=True)
                        step[summation], wire[model][summation] = seconds, metrics.get("allreduce_bytes_per_step", 0)
                    else:
                        run = compare_ddp.lockstep(build, model, extra=setting)
                        step[summation], wire[model][summation] = run["step_s"], run["bytes_per_step"]
                for variant, env in (("ddp_default_malloc", DEFAULT_MALLOC),
                                     ("ddp_raised_thresholds", dict(DEFAULT_MALLOC, **RAISED))):
                    step[variant] = (scripted_resnet.ddp(folder, env) if model == "resnet18"
                                     else compare_ddp.ddp(model, env)[0])
                for variant in VARIANTS:
                    ms[model][variant].append(step[variant] * 1000)
                ratios[model]["exact_over_float"].append(step["exact"] / step["float"])
                ratios[model]["exact_over_ddp_raised"].append(step["exact"] / step["ddp_raised_thresholds"])
                ratios[model]["exact_over_ddp_default"].append(step["exact"] / step["ddp_default_malloc"])
            print(f"repetition {rep + 1}/{repetitions} done", file=sys.stderr)
    error = json.loads(subprocess.run([os.path.join(build, "tests/bench/summation_error")], check=True,
                                      capture_output=True, text=True).stdout)
    result = {
        "benchmark": "exact summation (same bits on any world size) vs float vs PyTorch DDP",
        "setup": {"ranks": 2, "threads_per_rank": 1, "backend": "gloo", "cores": os.cpu_count(),
                  "batch_per_rank": {"mlp": 64, "cnn": 64, "deep_mlp": 64, "resnet18": scripted_resnet.BATCH},
                  "repetitions": repetitions, "order": "interleaved: per repetition, per model, exact, float, "
                  "DDP default malloc, DDP raised thresholds",
                  "ddp_raised_thresholds": RAISED,
                  "allocators": compare_ddp.allocator_settings(build),
                  "lockstep": subprocess.run([os.path.join(build, "lockstep"), "--version"],
                                             capture_output=True, text=True).stdout.strip()},
        "step_ms": {m: {v: compare_ddp.summary(ms[m][v]) for v in VARIANTS} for m in models},
        "ratios": {m: {k: compare_ddp.summary(v) for k, v in ratios[m].items()} for m in models},
        "allreduce_bytes_per_rank_per_step": wire,
        "accuracy_against_fp64": error,
    }
    for m in models:
        r, s = result["ratios"][m], result["step_ms"][m]
        print(f"{m:9s} exact {s['exact']['median']:7.2f} ms  float {s['float']['median']:7.2f} ms  "
              f"DDP {s['ddp_default_malloc']['median']:7.2f} / {s['ddp_raised_thresholds']['median']:7.2f} ms "
              f"(default / raised malloc)  exact/float {r['exact_over_float']['median']:.3f} "
              f"[{r['exact_over_float']['min']:.3f}, {r['exact_over_float']['max']:.3f}]  "
              f"exact/DDP raised {r['exact_over_ddp_raised']['median']:.3f}  "
              f"bytes/step {wire[m].get('exact', 0):.0f} vs {wire[m].get('float', 0):.0f}", file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
