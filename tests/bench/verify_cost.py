#!/usr/bin/python3
"""What checking the arithmetic costs.

Step time of a 2-rank `lockstep run` (Gloo, one thread per rank, exact
summation, one microbatch per rank) with audit.verify_every = 0 (no
cross-check), 1, 10 and 100, on the cnn (synthetic data, batch 64 per rank)
and the scripted resnet18 (scripted_resnet.py: batch 32 per rank, comm.buffers =
mean: the buffers too are the same on any world size). The step
time is the mean over the second half of the run, read from the step events'
times (a median would hide a check every 10 or 100 steps). Repetitions
interleaved (every setting of every model once per repetition); median and
range of each setting and of its cost against verify_every = 0.

The checks' own time, measured where they run (the audit phase, audits
being off), as a share of the training time: the same cost without the
run-to-run noise of step times. Also, from the runs with verify_every = 0: the share of training spent on
the step evidence every run records (each microbatch's gradient digest,
rank 0's state digest per step), and what `lockstep verify` costs: seconds
per replayed step on one rank (it computes both ranks' microbatches).
Prints a table to stderr, JSON to stdout.
Usage: tests/bench/verify_cost.py BUILD_DIR [repetitions] [models=cnn,resnet18]
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_ddp  # noqa: E402
import scripted_resnet  # noqa: E402
from compare_ddp import summary  # noqa: E402

EVERY = (0, 1, 10, 100)
STEPS = {"cnn": 400, "resnet18": 200}


def run(build, model, folder, every):
    runs = os.path.join(folder, f"runs-{time.time_ns()}")
    steps = STEPS[model]
    if model == "resnet18":
        job = os.path.join(compare_ddp.SOURCE, "examples/resnet18/job.toml")
        sets = ["data.name=arrays", f"data.train={folder}/data", f"data.test={folder}/data",
                f"model.path={folder}/resnet18.pt", f"data.batch_size={scripted_resnet.BATCH}", "comm.buffers=mean",
                "optim.warmup_steps=0", "optim.schedule=constant", "optim.nesterov=false", "precision=fp32"]
    else:
        job = os.path.join(compare_ddp.SOURCE, "examples/synthetic.toml")
        sets = ["model.name=cnn", "data.batch_size=64"]
    command = [os.path.join(build, "lockstep"), "run", job, "--nproc", "2"]
    for s in sets + [f"job.steps={steps}", f"job.log_every={steps // 2}", "audit.every=0", "eval.every=0",
                     "job.threads_per_rank=1", f"audit.verify_every={every}", f"job.run_dir={runs}"]:
        command += ["--set", s]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=compare_ddp.ENV)
    run_dir = glob.glob(runs + "/*")[0]
    events = [json.loads(line) for line in open(run_dir + "/events-rank0.jsonl")]
    at = {e["step"]: e["time"] for e in events if e["event"] == "step"}
    end = [e for e in events if e["event"] == "end"][0]
    mean_step = (at[steps] - at[steps // 2]) / (steps - steps // 2)
    phases = end["phases"]
    training = sum(phases.get(p, 0) for p in ("data", "forward_backward", "comm_wait", "optimizer", "audit"))
    # audit.every = 0: the audit phase holds the cross-checks alone (the
    # recomputation and the comparison), measured where they run.
    return {"step_s": mean_step, "run_dir": run_dir, "check_share": phases.get("audit", 0) / training if training else 0,
            "evidence_share": end["metrics"].get("step_evidence_s", 0) / training if training else 0,
            "cross_checks": end["metrics"].get("cross_checks", 0)}


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return os.uname().machine


def replay_seconds_per_step(build, run_dir, steps):
    started = time.time()
    subprocess.run([os.path.join(build, "lockstep"), "verify", run_dir], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=compare_ddp.ENV)
    return (time.time() - started) / steps


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(compare_ddp.SOURCE, "build")
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    models = sys.argv[3].split(",") if len(sys.argv) > 3 else ["cnn", "resnet18"]
    step_ms = {m: {e: [] for e in EVERY} for m in models}
    cost = {m: {e: [] for e in EVERY if e} for m in models}
    check_share = {m: {e: [] for e in EVERY if e} for m in models}
    evidence, replay = {m: [] for m in models}, {m: [] for m in models}
    with tempfile.TemporaryDirectory() as folder:
        if "resnet18" in models:
            scripted_resnet.prepare_folder(folder)
        for rep in range(repetitions):
            for model in models:
                base = None
                for every in EVERY:
                    r = run(build, model, folder, every)
                    step_ms[model][every].append(r["step_s"] * 1000)
                    if every == 0:
                        base = r["step_s"]
                        evidence[model].append(r["evidence_share"])
                        if rep == 0:
                            replay[model].append(replay_seconds_per_step(build, r["run_dir"], STEPS[model]))
                    else:
                        cost[model][every].append(r["step_s"] / base - 1)
                        check_share[model][every].append(r["check_share"])
            print(f"repetition {rep + 1}/{repetitions} done", file=sys.stderr)
    out = {"setup": {"ranks": 2, "backend": "gloo", "threads_per_rank": 1, "summation": "exact",
                     "microbatches_per_rank": 1, "steps": STEPS, "cnn_batch_per_rank": 64,
                     "resnet18_batch_per_rank": scripted_resnet.BATCH, "repetitions": repetitions,
                     "step_time": "mean over the second half of each run, from the step events' times",
                     "cpu": cpu_model(), "cores": os.cpu_count()},
           "models": {}}
    for model in models:
        out["models"][model] = {
            "step_ms": {f"verify_every_{e}": summary(step_ms[model][e]) for e in EVERY},
            "cost_vs_off": {f"verify_every_{e}": summary(cost[model][e]) for e in EVERY if e},
            "check_share_of_training": {f"verify_every_{e}": summary(check_share[model][e]) for e in EVERY if e},
            "step_evidence_share_of_training": summary(evidence[model]),
            "verify_replay_s_per_step": replay[model][0] if replay[model] else None,
        }
        print(f"{model}: step ms off {summary(step_ms[model][0])['median']:.1f}; cost "
              + ", ".join(f"every {e}: {100 * summary(cost[model][e])['median']:+.2f}% "
                          f"(checks {100 * summary(check_share[model][e])['median']:.2f}% of training)"
                          for e in EVERY if e)
              + f"; step evidence {100 * summary(evidence[model])['median']:.2f}% of training", file=sys.stderr)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
