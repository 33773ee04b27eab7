#!/usr/bin/python3
"""Image folders for lockstep's data tests, written by PIL from Debian's
Fashion-MNIST, laid out as torchvision's ImageFolder reads them.

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
import gzip
import json
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


def write_split(out, images, labels, per_class):
    counts = {c: 0 for c in range(10)}
    for i, (image, label) in enumerate(zip(images, labels)):
        label = int(label)
        if counts[label] >= per_class:
            continue
        counts[label] += 1
        folder = os.path.join(out, CLASSES[label])
        os.makedirs(folder, exist_ok=True)
        picture = Image.fromarray(image, mode="L")
        if i % 50 == 7:
            picture = picture.resize((56, 56), Image.BILINEAR)
        if i % 3 == 2:
            picture.save(os.path.join(folder, "%05d.jpg" % i), quality=95)
        else:
            picture.save(os.path.join(folder, "%05d.png" % i))
        if all(n >= per_class for n in counts.values()):
            break


def good(out, train_per_class=500, test_per_class=100):
    images = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    labels = idx("train-labels-idx1-ubyte.gz", 8)
    write_split(os.path.join(out, "train"), images, labels, train_per_class)
    test_images = idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    test_labels = idx("t10k-labels-idx1-ubyte.gz", 8)
    write_split(os.path.join(out, "test"), test_images, test_labels, test_per_class)
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
