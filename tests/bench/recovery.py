#!/usr/bin/python3
"""Recovery time of `lockstep run` on this machine: the mlp job on 2 ranks
with a checkpoint every 5 steps; rank 1 is killed (SIGKILL) at step 12, the
coordinator starts a new generation: the launcher starts a replacement for
rank 1, rank 0 rejoins from its own process, both continue from the
checkpoint of step 10. Prints JSON: the time from the death to the end of the
first step of the new generation and the steps redone (from manifest.json),
median and spread over the repetitions, and the whole run's wall time
against an uninterrupted one.
Usage: tests/bench/recovery.py BUILD_DIR [repetitions]
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from compare_ddp import summary  # noqa: E402  (median and spread, the same for every benchmark)
SETS = ["model.name=mlp", "job.steps=30", "checkpoint.every=5", "job.log_every=10"]


def run(build, extra):
    with tempfile.TemporaryDirectory() as runs:
        command = [os.path.join(build, "lockstep"), "run", os.path.join(SOURCE, "examples/synthetic.toml"),
                   "--nproc", "2"]
        for setting in SETS + [f"job.run_dir={runs}"] + extra:
            command += ["--set", setting]
        start = time.time()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.time() - start
        manifest = json.load(open(glob.glob(runs + "/*/manifest.json")[0]))
        return wall, manifest.get("restarts", []), manifest.get("coordinator", {})


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SOURCE, "build")
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    recovery, wall_ratio, redone, rejoined = [], [], [], 0
    for _ in range(repetitions):
        plain, _, _ = run(build, [])
        killed, restarts, coordinator = run(build, ["fault.max_restarts=1", "test.fail_rank=1",
                                                    "test.fail_step=12", "test.fail_kind=kill"])
        recovery.append(restarts[0]["recovery_s"])
        redone.append(restarts[0]["steps_redone"])
        rejoined += sum(1 for w in coordinator.get("workers", []) if w.get("back_from_generation") == 1)
        wall_ratio.append(killed / plain)
    result = {"benchmark": "recovery",
              "setup": {"model": "mlp", "ranks": 2, "steps": 30, "checkpoint_every": 5,
                        "killed": "rank 1 at step 12 (SIGKILL)", "resumed_from_step": 10,
                        "cores": os.cpu_count(), "repetitions": repetitions},
              "recovery_s_death_to_first_step": summary(recovery),
              "steps_redone": summary(redone),
              "survivors_rejoined_without_a_new_process": f"{rejoined} of {repetitions}",
              "wall_killed_over_uninterrupted": summary(wall_ratio)}
    r = result["recovery_s_death_to_first_step"]
    print(f"recovery (death to the first step of the new generation): {r['median']:.2f} s "
          f"[{r['min']:.2f}, {r['max']:.2f}], {result['steps_redone']['median']:g} steps redone, "
          f"survivor rejoined in its own process in {rejoined} of {repetitions}", file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
