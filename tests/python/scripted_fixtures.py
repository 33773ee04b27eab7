#!/usr/bin/env python3
"""Models, data and PyTorch references for lockstep's TorchScript tests.

  make DIR             DIR/tied.pt (a tied weight, a frozen layer, a loss
                       method), DIR/bn.pt (a CNN with BatchNorm), bad models,
                       and array folders: DIR/classes, DIR/values (float
                       targets with NaN), DIR/labels (multi-label with NaN),
                       DIR/images (for bn.pt), DIR/missing (all targets NaN),
                       DIR/bn_dropout28.pt (conv, BatchNorm, dropout; 28 x 28 grey, 10 classes),
                       DIR/nan_weight.pt, DIR/inf_buffer.pt, DIR/zero_weight.pt,
                       DIR/transformer.pt (an nn.TransformerEncoder classifier for DIR/classes),
                       DIR/bf16_train_fails.pt (a training step that cannot run in bf16),
                       DIR/fails_in_eval.pt (raises at its first evaluation during training)
  eager DIR DATA LOSS OPTIM LR STEPS BATCH SEED MODEL_FINAL
                       trains tied.pt's module eagerly in PyTorch on the
                       batches lockstep's sampler gives one rank, and prints
                       {"max_abs_diff": ...} against lockstep's model-final.pt
  score MODEL DATA LOSS
                       evaluates a model-final.pt on DATA/test in Python:
                       prints {"accuracy": ..., "loss": ...}
  params MODEL         prints every parameter and buffer of a TorchScript file as JSON lists
"""
import json
import os
import zipfile
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MASK = (1 << 64) - 1


class Tied(nn.Module):
    """8 -> frozen 8 -> 16 -> 16 -> 16 (tied to the layer before) -> 4."""

    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.encode = nn.Linear(8, 16)
        self.middle = nn.Linear(16, 16)
        self.again = nn.Linear(16, 16)
        self.again.weight = self.middle.weight  # a tied weight
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.frozen(x))
        x = torch.tanh(self.encode(x))
        x = torch.tanh(self.middle(x))
        x = torch.tanh(self.again(x))
        return self.head(x)

    @torch.jit.export
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # A Huber loss per sample, with per-target weights: not one lockstep has.
        weights = torch.tensor([1.0, 2.0, 0.5, 1.0], dtype=output.dtype)
        return (F.smooth_l1_loss(output, target, reduction="none") * weights).mean(1)


class BatchNormCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.head(x.flatten(1))


class DropoutBatchNormCnn(nn.Module):
    """[B, 1, 28, 28] (an image folder of Fashion-MNIST) -> 10 classes: two
    conv + BatchNorm + max-pool blocks, dropout before the head. Its dropout
    draws from LibTorch's generator inside the scripted module."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.head(self.drop(x.flatten(1)))


class TransformerClassifier(nn.Module):
    """[B, 8] -> 4 tokens of 16 -> a 2-layer nn.TransformerEncoder (batch_first, 2 heads) -> 4 classes.
    In eval mode without grad, PyTorch's encoder layer takes its fused fast path."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 4 * 16)
        layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).reshape(x.shape[0], 4, 16)
        return self.head(self.encoder(tokens).mean(1))


class Bf16TrainingFails(nn.Module):
    """A training step that insists on fp32 activations (as a custom op or a
    numerically fragile layer might): under bf16 autocast it raises."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.training and h.dtype != torch.float32:
            raise RuntimeError("the fragile layer needs fp32 activations while training")
        return h


class Bf16EvaluationFails(nn.Module):
    """Trains in bf16, but its evaluation forward insists on fp32 activations:
    what LibTorch 1.13's fused TransformerEncoder eval path did under CPU
    autocast ('expected scalar type BFloat16 but found Float'), kept as a
    module of its own since LibTorch 2.x fixed that path."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if not self.training and h.dtype != torch.float32:
            raise RuntimeError("expected scalar type Float but found BFloat16 in evaluation")
        return h


class FailsInLaterEvaluation(nn.Module):
    """Trains, then raises in evaluation once it has seen more than 3 training
    batches: after the dry run, at the first evaluation during training."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("batches_seen", torch.zeros(1, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.batches_seen += 1
        elif int(self.batches_seen.item()) > 3:
            raise RuntimeError("the evaluation head is not ready for this input")
        return self.fc(x)


class DictOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.body(x), "features": x}


def write_arrays(folder, x, y):
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y)


def write_from_a_newer_pytorch(source, path):
    """A copy of the scripted module `source` whose code calls an operator
    no LibTorch has, as a module scripted by a newer PyTorch calls one the
    older LibTorch lacks (2.x's Transformer layers call
    aten::scaled_dot_product_attention, absent from 1.13)."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as copy:
        changed = False
        for info in original.infolist():
            data = original.read(info.filename)
            if info.filename.endswith(".py") and b"torch.tanh(" in data and not changed:
                data = data.replace(b"torch.tanh(", b"torch.tanh_from_a_newer_pytorch(", 1)
                changed = True
            copy.writestr(info, data)
    if not changed:
        raise RuntimeError(f"{source}: no torch.tanh( in its code to replace")


def make(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(7)
    torch.jit.script(Tied()).save(os.path.join(out, "tied.pt"))
    torch.jit.script(BatchNormCnn()).save(os.path.join(out, "bn.pt"))
    torch.jit.script(DropoutBatchNormCnn()).save(os.path.join(out, "bn_dropout28.pt"))
    torch.jit.script(DictOutput()).save(os.path.join(out, "dict.pt"))
    torch.jit.script(TransformerClassifier()).save(os.path.join(out, "transformer.pt"))
    torch.jit.script(Bf16TrainingFails()).save(os.path.join(out, "bf16_train_fails.pt"))
    torch.jit.script(Bf16EvaluationFails()).save(os.path.join(out, "bf16_eval_fails.pt"))
    torch.jit.script(FailsInLaterEvaluation()).save(os.path.join(out, "fails_in_eval.pt"))
    torch.jit.freeze(torch.jit.script(Tied()).eval()).save(os.path.join(out, "frozen.pt"))
    broken = Tied()  # an uninitialised tensor, as torch.empty can leave one
    with torch.no_grad():
        broken.middle.weight[3, 4] = float("nan")
    torch.jit.script(broken).save(os.path.join(out, "nan_weight.pt"))
    zeroed = Tied()
    with torch.no_grad():
        zeroed.encode.weight.zero_()
    torch.jit.script(zeroed).save(os.path.join(out, "zero_weight.pt"))
    inf_buffer = BatchNormCnn()
    inf_buffer.bn.running_var.fill_(float("inf"))
    torch.jit.script(inf_buffer).save(os.path.join(out, "inf_buffer.pt"))
    with open(os.path.join(out, "not_a_module.pt"), "wb") as f:
        torch.save({"weight": torch.ones(3)}, f)
    write_from_a_newer_pytorch(os.path.join(out, "tied.pt"), os.path.join(out, "newer_op.pt"))
    rng = np.random.default_rng(3)
    teacher = rng.normal(size=(8, 4))
    for split, n in (("train", 64), ("test", 40)):
        x = rng.normal(size=(n, 8)).astype(np.float32)
        scores = x @ teacher
        write_arrays(f"{out}/classes/{split}", x, scores.argmax(1).astype(np.int64))
        values = (scores + 0.1 * rng.normal(size=scores.shape)).astype(np.float32)
        values[rng.random(values.shape) < 0.2] = np.nan
        write_arrays(f"{out}/values/{split}", x, values)
        labels = (scores > 0).astype(np.float32)
        labels[rng.random(labels.shape) < 0.2] = np.nan
        write_arrays(f"{out}/labels/{split}", x, labels)
        write_arrays(f"{out}/missing/{split}", x, np.full(scores.shape, np.nan, np.float32))
        write_arrays(f"{out}/wide/{split}", rng.normal(size=(n, 10)).astype(np.float32),
                     scores.argmax(1).astype(np.int64))
    image_teacher = rng.normal(size=(64, 4))
    for split, n in (("train", 256), ("test", 200)):
        x = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
        y = (x.reshape(n, 64) @ image_teacher).argmax(1).astype(np.int64)
        write_arrays(f"{out}/images/{split}", x, y)


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def permutation(size, seed, epoch):
    """lockstep's DistributedSampler permutation (runtime/sampler.cpp)."""
    perm = list(range(size))
    state = ((seed * 0x100000001B3) & MASK) ^ ((epoch + 0x51ED270B27A3C5C5) & MASK)
    for i in range(size - 1, 0, -1):
        bound = i + 1
        limit = MASK - (MASK % bound)
        while True:
            state, draw = splitmix64(state)
            if draw < limit:
                break
        j = draw % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def one_rank_batches(size, seed, batch, steps):
    epoch, order, position = 0, permutation(size, seed, 0), 0
    for _ in range(steps):
        if position >= size:
            epoch, order, position = epoch + 1, permutation(size, seed, epoch + 1), 0
        yield order[position:position + batch]
        position += batch


def masked_mean_loss(module, output, target, loss):
    if loss == "cross_entropy":
        return F.cross_entropy(output, target)
    valid = ~torch.isnan(target)
    filled = torch.where(valid, target, torch.zeros_like(target))
    if loss == "model":
        missing = (~valid).any(1)
        filled = torch.where(missing.unsqueeze(1), torch.zeros_like(target), target)
        each = module.loss(output, filled)
        return (each * (~missing)).sum() / (~missing).sum()
    each = {"mse": lambda: (output - filled) ** 2, "l1": lambda: (output - filled).abs(),
            "bce_with_logits": lambda: F.binary_cross_entropy_with_logits(output, filled, reduction="none")}[loss]()
    return (each * valid).sum() / valid.sum()


def eager(out, data, loss, optim, lr, steps, batch, seed, model_final):
    scripted = torch.jit.load(os.path.join(out, "tied.pt"))
    module = Tied()
    module.load_state_dict(scripted.state_dict())
    module.train()
    x = torch.from_numpy(np.load(f"{data}/train/x.npy"))
    y = torch.from_numpy(np.load(f"{data}/train/y.npy"))
    params = [p for p in module.parameters() if p.requires_grad]
    if optim == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    for rows in one_rank_batches(len(x), seed, batch, steps):
        optimizer.zero_grad()
        masked_mean_loss(module, module(x[rows]), y[rows], loss).backward()
        optimizer.step()
    trained = torch.jit.load(model_final)
    ours = dict(trained.named_parameters())
    worst = 0.0
    for name, p in module.named_parameters():
        worst = max(worst, (p.detach() - ours[name]).abs().max().item())
    start = dict(scripted.named_parameters())
    moved = max((p.detach() - start[n]).abs().max().item() for n, p in module.named_parameters())
    print(json.dumps({"max_abs_diff": worst, "max_moved": moved,
                      "tied_in_file": trained.again.weight.data_ptr() == trained.middle.weight.data_ptr(),
                      "frozen_unchanged": torch.equal(trained.frozen.weight, scripted.frozen.weight)}))


def score(model_final, data, loss):
    module = torch.jit.load(model_final)
    module.eval()
    x = torch.from_numpy(np.load(f"{data}/test/x.npy"))
    y = torch.from_numpy(np.load(f"{data}/test/y.npy"))
    with torch.no_grad():
        output = module(x)
        result = {"loss": masked_mean_loss(module, output, y, loss).item()}
        if loss == "cross_entropy":
            result["accuracy"] = (output.argmax(1) == y).double().mean().item()
    print(json.dumps(result))


def params(model_final):
    module = torch.jit.load(model_final)
    print(json.dumps({n: t.detach().double().flatten().tolist()
                      for n, t in list(module.named_parameters()) + list(module.named_buffers())}))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "make":
        make(args[0])
    elif command == "eager":
        eager(args[0], args[1], args[2], args[3], float(args[4]), int(args[5]), int(args[6]), int(args[7]), args[8])
    elif command == "score":
        score(args[0], args[1], args[2])
    elif command == "params":
        params(args[0])
    else:
        sys.exit(f"unknown command {command}")
