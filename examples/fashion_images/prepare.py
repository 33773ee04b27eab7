#!/usr/bin/env python3
"""Writes Fashion-MNIST as an image folder, the layout data.name = "images"
reads (and torchvision's ImageFolder): OUT/train/CLASS/NNNNN.png and
OUT/test/CLASS/..., the ten class names as folders. Every third image is a
JPEG (quality 95), the rest PNG, so both decoders are used.

Usage: .venv/bin/python3 examples/fashion_images/prepare.py [OUT] [TRAIN_PER_CLASS] [TEST_PER_CLASS]
(default OUT runs/fashion-images, all 60,000 + 10,000 images; about 30 s)
"""
import gzip
import os
import sys

import numpy as np
from PIL import Image

FMNIST = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle_boot"]


def idx(name, offset):
    with gzip.open(os.path.join(FMNIST, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def write_split(out, images, labels, per_class, resize_some=False):
    """The first `per_class` images of each class under out/CLASS/; with
    `resize_some`, every 50th is stored at 56 x 56 (lockstep resizes it back)."""
    counts = {c: 0 for c in range(10)}
    for i, (image, label) in enumerate(zip(images, labels)):
        label = int(label)
        if counts[label] >= per_class:
            continue
        counts[label] += 1
        folder = os.path.join(out, CLASSES[label])
        os.makedirs(folder, exist_ok=True)
        picture = Image.fromarray(image, mode="L")
        if resize_some and i % 50 == 7:
            picture = picture.resize((56, 56), Image.BILINEAR)
        if i % 3 == 2:
            picture.save(os.path.join(folder, "%05d.jpg" % i), quality=95)
        else:
            picture.save(os.path.join(folder, "%05d.png" % i))
        if all(n >= per_class for n in counts.values()):
            break


def fashion_mnist(split):
    prefix = "train" if split == "train" else "t10k"
    images = idx(prefix + "-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    labels = idx(prefix + "-labels-idx1-ubyte.gz", 8)
    return images, labels


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/fashion-images"
    train_per_class = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
    test_per_class = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    if os.path.isdir(os.path.join(out, "train")):
        print(out, "exists; remove it to write it again")
        return
    write_split(os.path.join(out, "train"), *fashion_mnist("train"), train_per_class)
    write_split(os.path.join(out, "test"), *fashion_mnist("test"), test_per_class)
    print("wrote", out, "(train/ and test/, one folder per class)")


if __name__ == "__main__":
    main()
