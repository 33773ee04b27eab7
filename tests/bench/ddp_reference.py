#!/usr/bin/python3
"""PyTorch DDP reference for lockstep's step-time benchmark.

The same models (mlp, cnn, deep_mlp), PyTorch's default initialisation
(which LibTorch's C++ modules share), the same batch per rank, the same
threads per rank, Gloo, N ranks on this machine, synthetic data in memory,
SGD with momentum. Prints one JSON object: step time over the timed steps.
Run with the project's torch: .venv/bin/python3 ddp_reference.py --model cnn
On a GPU (--device cuda): every rank on GPU LOCAL_RANK % count, batches
copied from pinned host memory (as a DataLoader with pin_memory does),
autocast to --precision, NCCL or Gloo (--backend; two ranks on one GPU
need Gloo), and a synchronize before each step's clock stops, so the time
is the GPU's work and not the launch.
"""
import argparse
import contextlib
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Cnn(nn.Module):
    def __init__(self, dropout=0.25):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64 * 7 * 7, 128)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(self.dropout(F.relu(self.fc(x.flatten(1)))))


class DeepNarrowMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.input = nn.Linear(784, 64)
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(24))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.input(x.flatten(1)))
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


MODELS = {"mlp": Mlp, "cnn": Cnn, "deep_mlp": DeepNarrowMlp}


DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def rank_main(rank, args, port, results):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)
    model = MODELS[args.model]().to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                                bucket_cap_mb=25)
    torch.manual_seed(args.seed + rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" else None
    images = torch.randn(args.batch * 8, 1, 28, 28)
    labels = torch.randint(0, 10, (args.batch * 8,))
    times = []
    first_step = None
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        rows = torch.randint(0, images.shape[0], (args.batch,))
        x, y = images[rows], labels[rows]
        if cuda:
            x = x.pin_memory().to(device, non_blocking=True)
            y = y.pin_memory().to(device, non_blocking=True)
        optimizer.zero_grad()
        low = DTYPES[args.precision]
        with torch.autocast(device.type, dtype=low) if low else contextlib.nullcontext():
            loss = F.cross_entropy(model(x).float(), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if cuda:
            torch.cuda.synchronize(device)
        if step == 0:
            first_step = time.time()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        results.put((statistics.median(times), first_step))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--precision", choices=sorted(DTYPES), default="fp32")
    args = parser.parse_args()
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    mp.spawn(rank_main, args=(args, port, results), nprocs=args.ranks, join=True)
    median, first_step = results.get()
    print(json.dumps({"peer": "pytorch-ddp", "torch": torch.__version__, "model": args.model,
                      "ranks": args.ranks, "batch_per_rank": args.batch, "threads": args.threads,
                      "device": args.device, "backend": args.backend, "precision": args.precision,
                      "steps": args.steps, "step_s_median": median, "first_step_unix_s": first_step}))


if __name__ == "__main__":
    main()
