#!/usr/bin/env python3
"""Array files for lockstep's data tests, written by numpy itself.

  good DIR   DIR/fmnist.npz (numpy.savez: uint8 images [N, 1, 28, 28] and
             int64 labels, from Debian's Fashion-MNIST, via
             python/lockstep_model.export_arrays), DIR/fmnist-test.npz, DIR/fmnist-1001.npz (1,001 test rows),
             DIR/fmnist-deflated.npz (savez_compressed), DIR/regress/{train,test}
             (x.npy float32 [N, 8], y.npy float32 [N, 4] with NaN)
  bad DIR    one damaged file or folder per kind (see BAD)
  big DIR N  DIR/big/x.npy: N uint8 images [N, 1, 28, 28] written through a
             memory map (never held in memory), y.npy int64 labels
"""
import gzip
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import lockstep_model  # noqa: E402

FMNIST = "/usr/share/datasets/fashion-mnist"


def idx(name, offset):
    with gzip.open(os.path.join(FMNIST, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def good(out):
    os.makedirs(out, exist_ok=True)
    images = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    labels = idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64)
    lockstep_model.export_arrays(images[:6000], labels[:6000], os.path.join(out, "fmnist.npz"))
    lockstep_model.export_arrays(images[6000:7000], labels[6000:7000], os.path.join(out, "fmnist-test.npz"))
    lockstep_model.export_arrays(images[7000:8001], labels[7000:8001], os.path.join(out, "fmnist-1001.npz"))
    lockstep_model.export_arrays(images[:6000], labels[:6000], os.path.join(out, "fmnist-deflated.npz"),
                                 compressed=True)
    rng = np.random.default_rng(1)
    teacher = rng.normal(size=(8, 4)).astype(np.float32)
    for split, n in (("train", 2048), ("test", 512)):
        folder = os.path.join(out, "regress", split)
        os.makedirs(folder, exist_ok=True)
        x = rng.normal(size=(n, 8)).astype(np.float32)
        y = (x @ teacher).astype(np.float32)
        y[rng.random(y.shape) < 0.25] = np.nan
        np.save(os.path.join(folder, "x.npy"), x)
        np.save(os.path.join(folder, "y.npy"), y)


def pair(folder, x, y):
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y)


def bad(out):
    x = np.zeros((16, 1, 28, 28), np.float32)
    y = np.zeros(16, np.int64)
    pair(f"{out}/big_endian", x.astype(">f4"), y)
    pair(f"{out}/fortran", np.asfortranarray(np.zeros((16, 784), np.float32)), y)
    pair(f"{out}/objects", x, np.array([None] * 16, dtype=object))
    pair(f"{out}/mismatch", x, np.zeros(15, np.int64))
    pair(f"{out}/truncated", x, y)
    with open(f"{out}/truncated/x.npy", "r+b") as f:
        f.truncate(os.path.getsize(f"{out}/truncated/x.npy") - 100)
    np.savez(f"{out}/wrong_keys.npz", images=x, labels=y)


def big(out, n):
    folder = os.path.join(out, "big")
    os.makedirs(folder, exist_ok=True)
    x = np.lib.format.open_memmap(os.path.join(folder, "x.npy"), mode="w+", dtype=np.uint8,
                                  shape=(n, 1, 28, 28))
    rng = np.random.default_rng(2)
    step = 100000
    for start in range(0, n, step):
        rows = min(step, n - start)
        x[start:start + rows] = rng.integers(0, 256, size=(rows, 1, 28, 28), dtype=np.uint8)
    x.flush()
    del x
    np.save(os.path.join(folder, "y.npy"), np.arange(n, dtype=np.int64) % 10)


if __name__ == "__main__":
    command, out = sys.argv[1], sys.argv[2]
    {"good": lambda: good(out), "bad": lambda: bad(out),
     "big": lambda: big(out, int(sys.argv[3]))}[command]()
