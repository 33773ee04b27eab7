#!/usr/bin/python3
"""lockstep against PyTorch DDP on this machine: same models, same batch per
rank, same threads per rank, Gloo, 2 ranks, synthetic data in memory.

Interleaved repetitions (lockstep, then DDP, per model), medians and spread.
Both sides report the median wall time of a step after 10 warm-up steps.
Also: the cnn with comm.overlap off (how much all-reduce the overlap hides),
the share of gradient bytes whose all-reduce finished before backward
ended, the data wait share, start-up (launch of the command to the end of
the first step, 2 local ranks, both sides) and peak memory per rank, and the cnn on 1 rank
against 2 (on a 2-core machine two ranks share the cores: this figure is for
honesty, not a scaling claim). Prints a table to stderr and JSON to stdout.
Usage: tests/bench/compare_ddp.py BUILD_DIR [repetitions]
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
STEPS = {"mlp": 300, "cnn": 120, "deep_mlp": 300}
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def lockstep(build, model, nproc=2, extra=()):
    with tempfile.TemporaryDirectory() as runs:
        steps = STEPS[model]
        command = [os.path.join(build, "lockstep"), "run", os.path.join(SOURCE, "examples/synthetic.toml"),
                   "--nproc", str(nproc)]
        for setting in (f"model.name={model}", "data.batch_size=64", f"job.steps={steps}",
                        f"job.log_every={steps // 2}", "audit.every=0", "eval.every=0",
                        f"job.run_dir={runs}", *extra):
            command += ["--set", setting]
        launched = time.time()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        folder = glob.glob(runs + "/*")[0]
        events = [json.loads(line) for line in open(folder + "/events-rank0.jsonl")]
        end = [e for e in events if e["event"] == "end"][0]
        first_step = [e for e in events if e["event"] == "first_step"][0]
        phases = json.load(open(folder + "/manifest.json"))["phases"]
        return {"step_s": end["metrics"]["step_s_median"],
                "comm_wait_per_step_s": phases["comm_wait"] / steps,
                "data_share": phases["data"] / (phases["data"] + phases["forward_backward"] +
                                                phases["comm_wait"] + phases["optimizer"]),
                "startup_s": first_step["time"] - launched, "peak_rss_mb": end["peak_rss_mb"],
                "hidden_share": end["metrics"]["allreduce_hidden_share"],
                "bytes_per_step": end["metrics"].get("allreduce_bytes_per_step", 0)}


def ddp(model, env=None):
    launched = time.time()
    out = subprocess.run([sys.executable, os.path.join(HERE, "ddp_reference.py"), "--model", model,
                          "--steps", str(STEPS[model] // 2)],
                         check=True, capture_output=True, text=True, env=env or ENV).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["step_s_median"], result["first_step_unix_s"] - launched


ALLOCATOR_ENV = ("LD_PRELOAD", "MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                 "MALLOC_CONF", "TCMALLOC_RELEASE_RATE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                 "PYTORCH_NO_CUDA_MEMORY_CACHING")
MALLOCS = ("jemalloc", "tcmalloc", "mimalloc")


def allocator_settings(build):
    """What allocates host memory on each side: the malloc each process
    links or preloads (glibc's unless one of MALLOCS shows up) and the
    environment variables that tune it, as the benchmark ran them."""
    env = {k: ENV[k] for k in ALLOCATOR_ENV if k in ENV}
    linked = subprocess.run(["ldd", os.path.join(build, "lockstep")], capture_output=True, text=True).stdout
    ours = [m for m in MALLOCS if m in linked or m in env.get("LD_PRELOAD", "")]
    probe = ("import torch, re; maps = open('/proc/self/maps').read(); "
             f"print(','.join(m for m in {MALLOCS!r} if m in maps))")
    theirs = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ENV).stdout.strip()
    describe = lambda found: found or "glibc malloc (LibTorch's CPU allocator: 64-byte aligned posix_memalign)"
    # lockstep sets glibc's thresholds itself unless the environment does
    # (its `malloc` decision); the DDP peer runs with whatever env says.
    thresholds = ("as the environment sets them" if any(k in env for k in ("MALLOC_MMAP_THRESHOLD_",
                                                                           "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD"))
                  else "mallopt at start: mmap threshold 32 MiB, trim threshold 1 GiB")
    return {"lockstep": {"malloc": describe(",".join(ours)), "env": env, "thresholds": thresholds},
            "pytorch_ddp": {"malloc": describe(theirs), "env": env, "torch": torch_version()}}


def torch_version():
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True).stdout.strip()


def summary(values):
    values = sorted(values)
    return {"median": statistics.median(values), "min": values[0], "max": values[-1]}


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SOURCE, "build")
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    samples = {key: [] for key in ("ratio_mlp", "ratio_cnn", "ratio_deep_mlp", "ls_mlp", "ls_cnn",
                                   "ls_deep_mlp", "ddp_mlp", "ddp_cnn", "ddp_deep_mlp", "hidden", "wait_saved",
                                   "data_share", "startup", "ddp_startup", "rss", "one_vs_two")}
    for rep in range(repetitions):
        for model in ("mlp", "cnn", "deep_mlp"):
            ours = lockstep(build, model)
            theirs, theirs_startup = ddp(model)
            samples["ls_" + model].append(ours["step_s"] * 1000)
            samples["ddp_" + model].append(theirs * 1000)
            samples["ratio_" + model].append(ours["step_s"] / theirs)
            if model == "cnn":
                plain = lockstep(build, "cnn", extra=("comm.overlap=false",))
                samples["wait_saved"].append(1 - ours["comm_wait_per_step_s"] / plain["comm_wait_per_step_s"])
                samples["hidden"].append(ours["hidden_share"])
                samples["data_share"].append(ours["data_share"])
                samples["startup"].append(ours["startup_s"])
                samples["ddp_startup"].append(theirs_startup)
                samples["rss"].append(ours["peak_rss_mb"])
                one = lockstep(build, "cnn", nproc=1)
                samples["one_vs_two"].append((128 / ours["step_s"]) / (64 / one["step_s"]))
        print(f"repetition {rep + 1}/{repetitions} done", file=sys.stderr)
    result = {
        "benchmark": "lockstep vs PyTorch DDP",
        "setup": {"ranks": 2, "batch_per_rank": 64, "threads_per_rank": 1, "backend": "gloo",
                  "data": "synthetic, in memory", "optimizer": "sgd momentum 0.9",
                  "cores": os.cpu_count(), "repetitions": repetitions, "steps": STEPS,
                  "order": "interleaved per repetition: lockstep, DDP per model",
                  "allocators": allocator_settings(build),
                  "lockstep": subprocess.run([os.path.join(build, "lockstep"), "--version"],
                                             capture_output=True, text=True).stdout.strip()},
        "step_ms": {m: {"lockstep": summary(samples["ls_" + m]), "ddp": summary(samples["ddp_" + m]),
                        "ratio": summary(samples["ratio_" + m])} for m in STEPS},
        "cnn_allreduce_bytes_done_before_backward_ended": summary(samples["hidden"]),
        "cnn_comm_wait_saved_by_overlap": summary(samples["wait_saved"]),
        "cnn_data_wait_share": summary(samples["data_share"]),
        "cnn_startup_s_launch_to_first_step": {"lockstep": summary(samples["startup"]),
                                               "ddp": summary(samples["ddp_startup"])},
        "cnn_peak_rss_mb_rank0": summary(samples["rss"]),
        "cnn_throughput_2_ranks_over_1": summary(samples["one_vs_two"]),
    }
    for m in STEPS:
        r = result["step_ms"][m]
        print(f"{m:9s} lockstep {r['lockstep']['median']:7.2f} ms  DDP {r['ddp']['median']:7.2f} ms  "
              f"ratio {r['ratio']['median']:.3f} [{r['ratio']['min']:.3f}, {r['ratio']['max']:.3f}]",
              file=sys.stderr)
    def line(label, figure, scale=1.0, unit=""):
        print(f"{label:44s} {figure['median'] * scale:8.3f}{unit} [{figure['min'] * scale:.3f}, "
              f"{figure['max'] * scale:.3f}]", file=sys.stderr)
    line("cnn: bytes reduced before backward ended", result["cnn_allreduce_bytes_done_before_backward_ended"])
    line("cnn: comm wait saved by overlap", result["cnn_comm_wait_saved_by_overlap"])
    line("cnn: data wait share of step", result["cnn_data_wait_share"])
    line("cnn: launch to first step, lockstep (s)", result["cnn_startup_s_launch_to_first_step"]["lockstep"])
    line("cnn: launch to first step, DDP (s)", result["cnn_startup_s_launch_to_first_step"]["ddp"])
    line("cnn: peak RSS rank 0 (MiB)", result["cnn_peak_rss_mb_rank0"])
    line("cnn: throughput 2 ranks / 1 rank", result["cnn_throughput_2_ranks_over_1"])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
