#!/usr/bin/env python3
"""Image folders for lockstep's data tests, written by PIL from Debian's
Fashion-MNIST by the example's own writer (examples/fashion_images/prepare.py),
laid out as torchvision's ImageFolder reads them.

  good DIR [TRAIN_PER_CLASS] [TEST_PER_CLASS]
             DIR/train/CLASS/*.png|jpg and DIR/test/CLASS/..., the ten
             Fashion-MNIST class names; every third image a JPEG (quality 95),
             every 50th stored at 56 x 56 (lockstep resizes it), and a
             README.txt in one class folder (not an image: ignored)
  corrupt DIR   adds to DIR/train: Bag/cut.png (half of a PNG) and
             Coat/not-an-image.jpg (text): found by the check at the start
  damaged DIR   adds DIR/train/Bag/damaged.png: a whole PNG (header and end
             intact) whose compressed pixels are overwritten: found only
             when it is decoded
  pil DIR FILE...   prints, per file, PIL's pixels as lockstep decodes them
             (grey, uint8) as a JSON list of sums, for comparison
"""
import json
import os
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "fashion_images"))
from prepare import fashion_mnist, write_split  # noqa: E402  (the example's own writer)


def good(out, train_per_class=500, test_per_class=100):
    write_split(os.path.join(out, "train"), *fashion_mnist("train"), train_per_class, resize_some=True)
    write_split(os.path.join(out, "test"), *fashion_mnist("test"), test_per_class, resize_some=True)
    with open(os.path.join(out, "train", "Bag", "README.txt"), "w") as f:
        f.write("bags, from Fashion-MNIST\n")


def a_png(out):
    folder = os.path.join(out, "train", "Bag")
    return os.path.join(folder, sorted(n for n in os.listdir(folder) if n.endswith(".png"))[0])


def corrupt(out):
    with open(a_png(out), "rb") as f:
        whole = f.read()
    with open(os.path.join(out, "train", "Bag", "cut.png"), "wb") as f:
        f.write(whole[: len(whole) // 2])
    with open(os.path.join(out, "train", "Coat", "not-an-image.jpg"), "w") as f:
        f.write("this is a note, not a JPEG\n")


def damaged(out):
    with open(a_png(out), "rb") as f:
        whole = bytearray(f.read())
    start = whole.index(b"IDAT") + 4
    for i in range(start + 2, min(start + 40, len(whole) - 16)):
        whole[i] = 0x55
    with open(os.path.join(out, "train", "Bag", "damaged.png"), "wb") as f:
        f.write(bytes(whole))


def pil(files):
    print(json.dumps([int(np.asarray(Image.open(f).convert("L"), np.int64).sum()) for f in files]))


if __name__ == "__main__":
    command, where = sys.argv[1], sys.argv[2]
    if command == "good":
        good(where, *[int(a) for a in sys.argv[3:5]])
    elif command == "corrupt":
        corrupt(where)
    elif command == "damaged":
        damaged(where)
    elif command == "pil":
        pil(sys.argv[3:])
    else:
        sys.exit("unknown command " + command)
