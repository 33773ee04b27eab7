#!/usr/bin/env python3
"""Hostile data files for lockstep's robustness tests, made here so that no
binary blob lives in the repository. Each name below is a folder (or .npz)
under OUT that a test passes as data.train; OUT/good is the clean pair and
OUT/img/good the clean image folders the hostile ones sit beside.

  npy OUT   OUT/npy/...: headers that crashed or fooled the .npy reader
            (a 60 KB descr, a shape of 3000 dimensions, a shape whose byte
            count wraps 64 bits, a 23-digit dimension, a negative one),
            targets out of range (200 in the last row only, all -5), every target
            missing (all -1: trains nothing), and
            .npz files whose zip records lie (a zip64 locator or directory
            pointing near 2^64, a member claiming 4 GiB from 1 MB)
  img OUT   OUT/img/...: class folders with a link back to themselves (one
            link, two links), a 30000 x 30000 PNG header (a decompression
            bomb, first and in the middle), 11 classes for a 10-output
            model, a class folder whose name is not UTF-8
"""
import io
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

ROWS = 64


def npy_bytes(header, data=b"", version=1):
    """A .npy file with `header` taken as it is (padded to 64 bytes as numpy does)."""
    text = header.encode("latin1")
    start = 10 if version == 1 else 12
    text += b" " * ((64 - (start + len(text) + 1) % 64) % 64) + b"\n"
    size = struct.pack("<H", len(text)) if version == 1 else struct.pack("<I", len(text))
    return b"\x93NUMPY" + bytes([version, 0]) + size + text + data


def pair(folder, x=None, y=None, x_bytes=None):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(3)
    if x_bytes is not None:
        with open(os.path.join(folder, "x.npy"), "wb") as f:
            f.write(x_bytes)
    else:
        np.save(os.path.join(folder, "x.npy"), rng.random((ROWS, 1, 28, 28), dtype=np.float32) if x is None else x)
    np.save(os.path.join(folder, "y.npy"), rng.integers(0, 10, ROWS).astype(np.int64) if y is None else y)


def zip_file(members):
    """A zip of (name, stored bytes, method, claimed uncompressed size) with honest offsets."""
    out, directory = io.BytesIO(), b""
    for name, payload, method, claimed in members:
        offset, raw = out.tell(), name.encode()
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, 0, len(payload),
                              claimed & 0xFFFFFFFF, len(raw), 0) + raw + payload)
        directory += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, 0, len(payload),
                                 claimed & 0xFFFFFFFF, len(raw), 0, 0, 0, 0, 0, offset) + raw
    start = out.tell()
    out.write(directory)
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(directory), start, 0))
    return out.getvalue()


def zip64_pointing_to(record_offset, record=b""):
    """A zip whose end record defers to a zip64 locator at `record_offset`."""
    head = b"PK\x03\x04" + bytes(26) + record
    locator = struct.pack("<IIQI", 0x07064B50, 0, record_offset, 1)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return head + locator + end


def npy(out):
    root = os.path.join(out, "npy")
    pair(os.path.join(root, "good"))
    shape = "(64, 1, 28, 28)"
    pair(os.path.join(root, "long_descr"),
         x_bytes=npy_bytes("{'descr': '<" + "a" * 60000 + "', 'fortran_order': False, 'shape': " + shape + ", }", version=2))
    pair(os.path.join(root, "long_shape"),
         x_bytes=npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (64" + ", 1" * 3000 + "), }", version=2))
    pair(os.path.join(root, "shape_wrap"),
         x_bytes=npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (64, 288230376151711744), }"))
    pair(os.path.join(root, "shape_digits"),
         x_bytes=npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 1), }"))
    pair(os.path.join(root, "shape_negative"),
         x_bytes=npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-64, 1, 28, 28), }",
                           bytes(64 * 28 * 28 * 4)))
    pair(os.path.join(root, "label_late"), y=np.array([1] * (ROWS - 1) + [200], np.int64))
    pair(os.path.join(root, "label_negative"), y=np.full(ROWS, -5, np.int64))
    pair(os.path.join(root, "label_missing"), y=np.full(ROWS, -1, np.int64))
    with open(os.path.join(root, "zip64_far.npz"), "wb") as f:
        f.write(zip64_pointing_to(0xFFFFFFFFFFFFFFF0))
    record = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, 1, 1, 46, 0xFFFFFFFFFFFFFFE0)
    with open(os.path.join(root, "zip64_directory.npz"), "wb") as f:
        f.write(zip64_pointing_to(30, record))
    x, y = io.BytesIO(), io.BytesIO()
    np.save(x, np.random.default_rng(4).random((ROWS, 1, 28, 28), dtype=np.float32))
    np.save(y, np.zeros(ROWS, np.int64))
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    x_deflated = deflate.compress(x.getvalue()) + deflate.flush()
    with open(os.path.join(root, "claims_4g.npz"), "wb") as f:
        f.write(zip_file([("x.npy", x_deflated, 8, 0xFFFFFFF0), ("y.npy", y.getvalue(), 0, len(y.getvalue()))]))


def png_header_only(path, width, height):
    """A PNG whose IHDR claims width x height: the check at the start must refuse it from the header."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(bytes(width + 1))) + chunk(b"IEND", b""))


def image_folders(root, classes=10, per_class=4, name=lambda c: f"class{c:02d}"):
    rng = np.random.default_rng(5)
    for split in ("train", "test"):
        for c in range(classes):
            folder = os.path.join(root, split, name(c))
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (28, 28), dtype=np.uint8)
                Image.fromarray(pixels, "L").save(os.path.join(folder, f"{i}.png"))


def img(out):
    root = os.path.join(out, "img")
    image_folders(os.path.join(root, "good"))
    for links in (1, 2):
        folders = os.path.join(root, f"loop{links}")
        image_folders(folders)
        for n in range(links):
            os.symlink(".", os.path.join(folders, "train", "class03", "ab"[n]))
    for where, folder, name in (("first", "class00", "0-bomb.png"), ("middle", "class05", "2.png")):
        folders = os.path.join(root, f"bomb_{where}")
        image_folders(folders)
        png_header_only(os.path.join(folders, "train", folder, name), 30000, 30000)
    image_folders(os.path.join(root, "classes11"), classes=11)
    nonutf8 = os.path.join(root, "nonutf8").encode()
    image_folders(nonutf8.decode("utf-8", "surrogateescape"),
                  name=lambda c: (b"c\xff\xfe9" if c == 9 else f"class{c:02d}".encode()).decode("utf-8",
                                                                                                "surrogateescape"))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("npy", "img"):
        sys.exit(__doc__)
    {"npy": npy, "img": img}[sys.argv[1]](sys.argv[2])
