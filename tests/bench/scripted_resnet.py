#!/usr/bin/python3
"""The scripted resnet18 example in lockstep against the same model trained
eagerly under PyTorch DDP, and TorchScript's own cost against eager.

Both sides: torchvision's resnet18 (grey input repeated to 3 channels, the
example's examples/resnet18/prepare.py), the same initial weights, the same
synthetic images held in memory (a .npy folder for lockstep, the same
arrays for DDP), batch 32 per rank, 1 thread per rank, Gloo, 2 ranks, SGD
with momentum, BatchNorm buffers broadcast from rank 0 (DDP's default, and
lockstep's comm.buffers = broadcast). Repetitions are interleaved (lockstep,
then DDP); each side reports the median step after 10 warm-up steps.
One rank: the scripted module against the eager one in one Python process,
alternating blocks of steps. Prints a table to stderr and JSON to stdout.
Usage: tests/bench/scripted_resnet.py BUILD_DIR [repetitions]
"""
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "examples", "resnet18"))
import prepare  # noqa: E402
from compare_ddp import allocator_settings, summary  # noqa: E402  (as every benchmark reports them)

STEPS, WARMUP, BATCH, SAMPLES = 40, 10, 32, 1024
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def lockstep(build, folder, nproc=2, extra=(), metrics=False):
    runs = os.path.join(folder, f"runs-{time.time_ns()}")
    command = [os.path.join(build, "lockstep"), "run", os.path.join(SOURCE, "examples/resnet18/job.toml"),
               "--nproc", str(nproc)]
    for setting in ("data.name=arrays", f"data.train={folder}/data", f"data.test={folder}/data",
                    f"model.path={folder}/resnet18.pt", f"data.batch_size={BATCH}", f"job.steps={STEPS}",
                    f"job.log_every={STEPS}", "audit.every=0", "eval.every=0", "optim.warmup_steps=0",
                    "optim.schedule=constant", "optim.nesterov=false", "job.threads_per_rank=1",
                    "precision=fp32", f"job.run_dir={runs}", *extra):
        command += ["--set", setting]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    events = [json.loads(line) for line in open(glob.glob(runs + "/*/events-rank0.jsonl")[0])]
    end = [e for e in events if e["event"] == "end"][0]["metrics"]
    return (end["step_s_median"], end) if metrics else end["step_s_median"]


def ddp_rank(rank, folder, port, results):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = prepare.GreyResNet18()
    model.load_state_dict(torch.jit.load(os.path.join(folder, "resnet18.pt")).state_dict())
    model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.from_numpy(np.load(os.path.join(folder, "data/x.npy")))
    y = torch.from_numpy(np.load(os.path.join(folder, "data/y.npy")))
    generator = torch.Generator().manual_seed(rank)
    times = []
    for step in range(STEPS):
        start = time.perf_counter()
        rows = torch.randint(0, len(x), (BATCH,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        optimizer.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    if rank == 0:
        results.put(statistics.median(times))
    dist.destroy_process_group()


def ddp(folder, env=None):
    """The median step of DDP on 2 ranks; `env` (for example malloc's
    thresholds) is what the two spawned ranks start with."""
    saved = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        return ddp_spawned(folder)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def ddp_spawned(folder):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    mp.spawn(ddp_rank, args=(folder, port, results), nprocs=2, join=True)
    return results.get()


def prepare_folder(folder):
    """The scripted resnet18 and SAMPLES synthetic images (a .npy folder) in `folder`."""
    subprocess.run([sys.executable, os.path.join(SOURCE, "examples/resnet18/prepare.py"),
                    os.path.join(folder, "resnet18.pt")], check=True, stdout=subprocess.DEVNULL)
    os.makedirs(os.path.join(folder, "data"))
    rng = np.random.default_rng(0)
    np.save(os.path.join(folder, "data/x.npy"), rng.normal(size=(SAMPLES, 1, 28, 28)).astype(np.float32))
    np.save(os.path.join(folder, "data/y.npy"), rng.integers(0, 10, SAMPLES).astype(np.int64))


def one_rank_script_vs_eager(folder, blocks=3, steps=10):
    """Step times (s) of the scripted and the eager module, alternating blocks."""
    torch.set_num_threads(1)
    scripted = torch.jit.load(os.path.join(folder, "resnet18.pt"))
    eager = prepare.GreyResNet18()
    eager.load_state_dict(scripted.state_dict())
    x = torch.randn(BATCH, 1, 28, 28)
    y = torch.randint(0, 10, (BATCH,))
    timings = {"script": [], "eager": []}
    for block in range(blocks + 1):
        for name, module in (("script", scripted), ("eager", eager)):
            optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
            for _ in range(steps):
                start = time.perf_counter()
                optimizer.zero_grad()
                F.cross_entropy(module(x), y).backward()
                optimizer.step()
                if block > 0:  # block 0 warms both up (TorchScript profiles its first runs)
                    timings[name].append(time.perf_counter() - start)
    return statistics.median(timings["script"]), statistics.median(timings["eager"])


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SOURCE, "build")
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    samples = {k: [] for k in ("lockstep_ms", "ddp_ms", "ratio", "script_ms", "eager_ms", "script_ratio")}
    with tempfile.TemporaryDirectory() as folder:
        prepare_folder(folder)
        for rep in range(repetitions):
            ours, theirs = lockstep(build, folder), ddp(folder)
            samples["lockstep_ms"].append(ours * 1000)
            samples["ddp_ms"].append(theirs * 1000)
            samples["ratio"].append(ours / theirs)
            script, eager = one_rank_script_vs_eager(folder)
            samples["script_ms"].append(script * 1000)
            samples["eager_ms"].append(eager * 1000)
            samples["script_ratio"].append(script / eager)
            print(f"repetition {rep + 1}/{repetitions}: lockstep {ours * 1000:.1f} ms, DDP {theirs * 1000:.1f} ms, "
                  f"1 rank script {script * 1000:.1f} ms vs eager {eager * 1000:.1f} ms", file=sys.stderr)
    result = {
        "benchmark": "scripted resnet18: lockstep vs PyTorch DDP (eager), and TorchScript vs eager",
        "setup": {"model": "torchvision resnet18, grey input repeated to 3 channels, 10 classes",
                  "input": [1, 28, 28], "ranks": 2, "batch_per_rank": BATCH, "threads_per_rank": 1,
                  "backend": "gloo", "data": f"{SAMPLES} synthetic images in memory",
                  "optimizer": "sgd momentum 0.9", "buffers": "broadcast from rank 0 (both)",
                  "steps": STEPS, "warmup_steps": WARMUP, "cores": os.cpu_count(),
                  "torch": torch.__version__, "repetitions": repetitions,
                  "order": "interleaved per repetition: lockstep, DDP, then 1-rank script/eager blocks",
                  "allocators": allocator_settings(build)},
        "step_ms_2_ranks": {"lockstep": summary(samples["lockstep_ms"]), "ddp": summary(samples["ddp_ms"]),
                            "ratio_lockstep_over_ddp": summary(samples["ratio"])},
        "step_ms_1_rank_python": {"torchscript": summary(samples["script_ms"]),
                                  "eager": summary(samples["eager_ms"]),
                                  "ratio_script_over_eager": summary(samples["script_ratio"])},
    }
    r = result["step_ms_2_ranks"]["ratio_lockstep_over_ddp"]
    s = result["step_ms_1_rank_python"]["ratio_script_over_eager"]
    print(f"2 ranks: lockstep/DDP step time {r['median']:.3f} [{r['min']:.3f}, {r['max']:.3f}]; "
          f"1 rank: TorchScript/eager {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]", file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
