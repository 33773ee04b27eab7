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
  elastic_replaced: the same elastic job, but a replacement is started at
    the kill (a supervisor's best): the world size is kept, the new rank gets
    the state from a live peer.
  checkpoint_replaced (fault.max_restarts = 1, a checkpoint every 2/3 of the
    kill step): the same kill and replacement, every rank back to the newest
    checkpoint (today's restart).

Seconds lost per shrink / replacement: from the kill until the job is back at
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
        """(world size, [step of each rank], state, generation) from the metrics endpoint; None while it is not up."""
        try:
            text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=2).read().decode()
        except OSError:
            return None
        world = re.search(r"^lockstep_world_size\{[^}]*\} (\S+)", text, re.M)
        steps = [float(v) for v in re.findall(r"^lockstep_rank_step\{[^}]*\} (\S+)", text, re.M)]
        state = re.search(r'^lockstep_up\{[^}]*state="(\w+)"', text, re.M)
        generation = re.search(r"^lockstep_generation\{[^}]*\} (\S+)", text, re.M)
        return (int(float(world.group(1))) if world else 0, steps, state.group(1) if state else "",
                int(float(generation.group(1))) if generation else 0)

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


def back_at(step, world, after_generation=0):
    """The job runs on `world` ranks in a generation after `after_generation`, each past `step`."""
    return lambda w, steps, state, generation: (state == "running" and w == world and len(steps) == world and
                                                generation > after_generation and min(steps) >= step)


KILL_AT = {"cnn": 30, "resnet18": 12}


def one_run(build, model, scenario):
    """scenario: shrink (elastic, nobody replaces the dead rank, then a new
    worker grows it back), elastic_replaced or checkpoint_replaced (a
    replacement started at the kill: the state from a live peer, or from
    the newest checkpoint)."""
    with tempfile.TemporaryDirectory() as folder:
        job_file, sets = model_sets(model, folder)
        every = KILL_AT[model] * 2 // 3  # the kill lands a third of an interval after a checkpoint
        extra = (["fault.max_restarts=1", f"checkpoint.every={every}"] if scenario == "checkpoint_replaced"
                 else ["elastic.min_ranks=2", "elastic.replace_wait_s=1"])
        job = Job(build, job_file, sets + extra, folder)
        try:
            for local in range(4):
                job.start_worker(local)
            job.wait_until(back_at(KILL_AT[model], 4), 600)
            victim = job.rank_pid(3)
            _, steps, _, generation = job.sample()
            reached = max(steps)
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            if scenario != "shrink":
                job.start_worker(3)  # a supervisor replaces it at once
                back = job.wait_until(back_at(reached, 4, generation), 600)
                return {f"{scenario}_s": back - killed}
            back = job.wait_until(back_at(reached, 2, generation), 600)
            result = {"shrink_s": back - killed}
            _, steps, _, generation = job.sample()
            started = time.time()
            job.start_worker(3)
            grown = job.wait_until(back_at(max(steps) + 1, 4, generation), 600)
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
        "kill_at_step": KILL_AT, "checkpoint_every": {m: k * 2 // 3 for m, k in KILL_AT.items()},
        "replaced": "a replacement started at the kill, for the dead rank's slot (LOCAL_RANK): the "
                    "coordinator restarts at once instead of after the heartbeat timeout",
        "repetitions": repetitions}, "models": {}}
    for model in models:
        figures = {}
        for _ in range(repetitions):
            for scenario in ("shrink", "elastic_replaced", "checkpoint_replaced"):  # side by side
                for key, value in one_run(build, model, scenario).items():
                    figures.setdefault(key, []).append(value)
        out["models"][model] = {key: summary(values) for key, values in figures.items() if values}
        print(json.dumps(out["models"][model]), file=sys.stderr)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
