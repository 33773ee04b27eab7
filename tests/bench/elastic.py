#!/usr/bin/python3
"""Seconds an elastic job loses when a rank goes, and when workers come
back, against a restart from the newest checkpoint. One machine, loopback:
a `lockstep coordinator` and 4 `lockstep worker` processes started by hand
(nobody replaces a dead one unless the benchmark does), 4 microbatches a
step, fault.heartbeat_timeout_s = 3 for all.

  elastic (elastic.min_ranks = 2, elastic.replace_wait_s = 1): rank 3 is
    killed (SIGKILL) mid-run; 3 survivors, so the job goes on with 2 ranks
    (one waits as a standby) from the state they hold in memory. Then one
    new worker starts: with the standby, 4 wait, and the job regroups to 4.
  checkpoint (fault.max_restarts = 1, checkpoint.every = 20): the same kill,
    a replacement started at once (a supervisor's best), every rank back to
    the newest checkpoint.

Seconds lost per shrink / restart: from the kill until the job is back at
the step it had reached (detection, decision, state transfer or checkpoint
read, redone steps). Per grow: from the new worker's start until 4 ranks
train past the step where they regrouped. Read from the coordinator's
Prometheus endpoint (lockstep_world_size, lockstep_rank_step), polled every
50 ms. Prints JSON: median and spread over the repetitions.
Usage: tests/bench/elastic.py BUILD_DIR [repetitions] [models=cnn,resnet18]
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from compare_ddp import summary  # noqa: E402  (median and spread, the same for every benchmark)

TOKEN = "elastic-bench-token-0123456789abcdef"
COMMON = ["job.threads_per_rank=1", "fault.heartbeat_s=0.5", "fault.heartbeat_timeout_s=3",
          "job.steps=100000", "audit.every=0", "eval.every=0", "job.log_every=1000"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_sets(model, folder):
    if model == "cnn":
        return (os.path.join(SOURCE, "examples/fashion_mnist_cnn.toml"),
                ["data.global_batch=256", "data.microbatch=64"])
    # examples/resnet18: torchvision's resnet18 scripted by this PyTorch, on Fashion-MNIST.
    python = os.environ.get("LOCKSTEP_PYTHON", os.path.join(SOURCE, ".venv/bin/python3"))
    model_file = os.path.join(folder, "resnet18.pt")
    subprocess.run([python, os.path.join(SOURCE, "examples/resnet18/prepare.py"), model_file],
                   check=True, stdout=subprocess.DEVNULL)
    return (os.path.join(SOURCE, "examples/resnet18/job.toml"),
            [f"model.path={model_file}", "comm.buffers=mean", "data.global_batch=32", "data.microbatch=8",
             "optim.warmup_steps=0", "optim.schedule=constant"])


class Job:
    def __init__(self, build, job_file, sets, folder):
        self.build, self.folder = build, folder
        self.address = f"127.0.0.1:{free_port()}"
        self.metrics = f"127.0.0.1:{free_port()}"
        self.env = dict(os.environ, LOCKSTEP_TOKEN=TOKEN)
        command = [os.path.join(build, "lockstep"), "coordinator", job_file, "--listen", self.address,
                   "--metrics", self.metrics]
        for s in COMMON + sets + [f"job.run_dir={folder}/runs", "job.world_size=4"]:
            command += ["--set", s]
        self.log = open(os.path.join(folder, "coordinator.log"), "w")
        self.coordinator = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        self.workers = []

    def start_worker(self, local_rank):
        env = dict(self.env, LOCAL_RANK=str(local_rank))
        log = open(os.path.join(self.folder, f"worker-{len(self.workers)}.log"), "w")
        self.workers.append(subprocess.Popen(
            [os.path.join(self.build, "lockstep"), "worker", "--coordinator", self.address],
            stdout=log, stderr=subprocess.STDOUT, env=env))
        return self.workers[-1]

    def sample(self):
        """(world size, [step of each rank]) from the metrics endpoint; None while it is not up."""
        try:
            text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=2).read().decode()
        except OSError:
            return None
        world = re.search(r"^lockstep_world_size\{[^}]*\} (\S+)", text, re.M)
        steps = [float(v) for v in re.findall(r"^lockstep_rank_step\{[^}]*\} (\S+)", text, re.M)]
        state = re.search(r'^lockstep_up\{[^}]*state="(\w+)"', text, re.M)
        return (int(float(world.group(1))) if world else 0, steps, state.group(1) if state else "")

    def wait_until(self, test, timeout):
        end = time.time() + timeout
        while time.time() < end:
            s = self.sample()
            if s and test(*s):
                return time.time()
            time.sleep(0.05)
        raise RuntimeError(f"timed out; see {self.folder}")

    def rank_pid(self, rank):
        text = open(os.path.join(self.folder, "coordinator.log")).read()
        found = re.findall(rf"rank {rank} = [^,)]*pid (\d+)", text)
        return int(found[-1])

    def stop(self):
        for p in self.workers + [self.coordinator]:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.log.close()


def back_at(step, world):
    return lambda w, steps, state: state == "running" and w == world and len(steps) == world and min(steps) >= step


def one_run(build, model, elastic):
    with tempfile.TemporaryDirectory() as folder:
        job_file, sets = model_sets(model, folder)
        extra = (["elastic.min_ranks=2", "elastic.replace_wait_s=1"] if elastic
                 else ["fault.max_restarts=1", "checkpoint.every=20"])
        job = Job(build, job_file, sets + extra, folder)
        try:
            for local in range(4):
                job.start_worker(local)
            job.wait_until(back_at(30, 4), 300)
            victim = job.rank_pid(3)
            reached = max(job.sample()[1])
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            if not elastic:
                job.start_worker(3)  # a supervisor replaces it at once
                back = job.wait_until(back_at(reached, 4), 300)
                return {"restart_s": back - killed}
            back = job.wait_until(back_at(reached, 2), 300)
            result = {"shrink_s": back - killed}
            regroup_from = max(job.sample()[1])
            started = time.time()
            job.start_worker(3)
            grown = job.wait_until(back_at(regroup_from + 1, 4), 300)
            result["grow_s"] = grown - started
            transfers = []
            for name in os.listdir(os.path.join(folder, "runs")):
                for rank in range(4):
                    path = os.path.join(folder, "runs", name, f"events-rank{rank}.jsonl")
                    if os.path.exists(path):
                        for line in open(path):
                            event = json.loads(line)
                            if event.get("event") == "state_transfer":
                                transfers.append(event["seconds"])
            result["state_transfer_s"] = max(transfers) if transfers else -1
            return result
        finally:
            job.stop()


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SOURCE, "build")
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    models = (sys.argv[3] if len(sys.argv) > 3 else "cnn,resnet18").split(",")
    out = {"benchmark": "elastic", "setup": {
        "machine": "one host, loopback; coordinator and 4 workers as processes", "cores": os.cpu_count(),
        "heartbeat_timeout_s": 3, "microbatches_per_step": 4, "elastic": "min_ranks 2, replace_wait_s 1",
        "checkpoint_restart": "max_restarts 1, checkpoint.every 20, replacement started at the kill",
        "repetitions": repetitions}, "models": {}}
    for model in models:
        figures = {"shrink_s": [], "grow_s": [], "state_transfer_s": [], "restart_s": []}
        for _ in range(repetitions):
            for elastic in (True, False):  # side by side within each repetition
                for key, value in one_run(build, model, elastic).items():
                    figures[key].append(value)
        out["models"][model] = {key: summary(values) for key, values in figures.items() if values}
        print(json.dumps(out["models"][model]), file=sys.stderr)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
