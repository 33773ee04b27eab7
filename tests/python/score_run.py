#!/usr/bin/env python3
"""Scores a run's model-final.pt in PyTorch, as a user would, on Fashion-MNIST's
test set: torch.jit.load, the inputs normalised as lockstep normalises them,
the same evaluation batches (rank r of W takes samples r, r + W, ... in
batches of eval.batch_size), one intra-op thread, and bf16 autocast where the
run evaluated in bf16. Prints {"accuracy": ..., "samples": ..., "manifest_accuracy": ...}.

  score_run.py RUN_DIR
"""
import gzip
import json
import os
import sys

import numpy as np
import torch


def idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def evaluation_precision(manifest):
    precision = "fp32"
    for decision in manifest.get("decisions", []):
        if decision.get("what") == "precision":
            precision = decision.get("value", precision)
    for decision in manifest.get("decisions", []):
        if decision.get("what") == "eval_precision":
            precision = decision.get("value", precision)
    return precision


def main(run):
    manifest = json.load(open(os.path.join(run, "manifest.json")))
    config = manifest["config"]
    folder = config["data"]["path"]
    images = idx(os.path.join(folder, "t10k-images-idx3-ubyte.gz"), 16).reshape(-1, 1, 28, 28)
    labels = torch.from_numpy(idx(os.path.join(folder, "t10k-labels-idx1-ubyte.gz"), 8).astype(np.int64))
    inputs = torch.from_numpy(images.copy()).float().div_(255.0).sub_(0.2860).div_(0.3530)
    torch.set_num_threads(1)
    model = torch.jit.load(os.path.join(run, "model-final.pt"))
    model.eval()
    world, batch = int(manifest["world_size"]), int(config["eval"]["batch_size"])
    bf16 = evaluation_precision(manifest) == "bf16"
    hits = 0
    with torch.no_grad():
        for rank in range(world):
            mine = torch.arange(rank, len(labels), world)
            for start in range(0, len(mine), batch):
                rows = mine[start:start + batch]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    output = model(inputs[rows])
                # The first of topk(5), as lockstep counts a hit: in bf16 two logits
                # tie often enough (about 0.4% of samples) for argmax to pick another.
                predicted = output.float().topk(min(5, output.shape[1]), 1)[1][:, 0]
                hits += int((predicted == labels[rows]).sum())
    print(json.dumps({"accuracy": hits / len(labels), "samples": len(labels), "bf16": bf16,
                      "manifest_accuracy": manifest["metrics"]["test_accuracy"]}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
