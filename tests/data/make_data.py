#!/usr/bin/env python3
"""Writes a small synthetic image data set in one of the formats dptrain reads (idx, cifar10,
cifar100, npy), so tests and examples need no download. Pure Python (no numpy: CI may lack it) and
deterministic from --seed.

Without --learnable: uniformly random pixels and labels (every class present in the training set,
so num_classes is --classes in every format). With --learnable: class k has its own per-channel
colour level and horizontal stripes of a class-dependent period, plus noise; both cues survive a
random crop (+-4 px shift with zero padding) and a horizontal flip, so a small CNN learns them well
above chance within a few hundred SGD steps.

  python3 tests/data/make_data.py DIR --format idx|cifar10|cifar100|npy [--gzip] --train N
      --test M --rows H --cols W --channels C --classes K --seed S [--learnable] [--npy-4d]
      [--label-dtype '<i8'] [--levels-seed S2] [--relabel K2]

idx: train-/t10k-images-idx3-ubyte (C == 1) or -idx4-ubyte (C > 1), -labels-idx1-ubyte; --gzip
writes them .gz. cifar10: data_batch_1.bin (all training records) and test_batch.bin; cifar100:
train.bin and test.bin (coarse label = fine // 5); both need 32x32x3. npy: train_/test_images.npy
(N x H x W when C == 1 unless --npy-4d, else N x H x W x C, '|u1') and train_/test_labels.npy
(--label-dtype, default '|u1').

Related tasks (fine-tuning tests): --levels-seed fixes the classes' colour levels apart from the
images drawn (--seed), so two sets share what tells their classes apart; --relabel K2 writes each
image's class k as k mod K2: K2 classes, each the union of classes the first set separates.
"""
import argparse
import gzip
import os
import random
import struct
import sys


def stripe_period(k):
    # Periods 2..7 rows: visible in 32 and 28 pixel images whatever the vertical shift.
    return 2 + k % 6


def make_levels(channels, classes, seed):
    """levels[c][k]: the base intensity of channel c in class k."""
    # Each channel takes the class's rank in a seeded permutation, spread over 40..200: with one
    # channel the classes are 10+ levels apart (for <= 16 classes), with three the colours differ.
    rng = random.Random(seed * 7919 + 17)
    levels = []
    for c in range(channels):
        order = list(range(classes))
        if c > 0:
            rng.shuffle(order)
        step = 160 / max(classes - 1, 1)
        levels.append([int(40 + step * order[k]) for k in range(classes)])
    return levels


def make_image(rng, label, rows, cols, channels, learnable, levels):
    """One image as bytes, H x W x C row-major."""
    if not learnable:
        return bytes(rng.getrandbits(8) for _ in range(rows * cols * channels))
    period = stripe_period(label)
    phase = rng.randrange(period)
    base = [levels[c][label] for c in range(channels)]
    out = bytearray(rows * cols * channels)
    i = 0
    for y in range(rows):
        # Bright half of each period, dark the other: a stripe pattern along y only, so a
        # horizontal flip leaves it unchanged and a shift only moves its phase.
        stripe = 45 if ((y + phase) % period) < (period + 1) // 2 else -45
        for _x in range(cols):
            for c in range(channels):
                v = base[c] + stripe + rng.randint(-20, 20)
                out[i] = 0 if v < 0 else 255 if v > 255 else v
                i += 1
    return bytes(out)


def make_split(rng, n, classes, all_classes, rows, cols, channels, learnable, levels):
    if all_classes:
        if n < classes:
            sys.exit(f"make_data.py: --train {n} is fewer than --classes {classes}: every class "
                     "must appear in the training set")
        labels = [i % classes for i in range(n)]
        rng.shuffle(labels)
    else:
        labels = [rng.randrange(classes) for _ in range(n)]
    images = [make_image(rng, k, rows, cols, channels, learnable, levels) for k in labels]
    return images, labels


def write(path, data, gz=False):
    if gz:
        # mtime=0: the same bytes on every run.
        with open(path + ".gz", "wb") as f:
            with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
                g.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)


def idx_bytes(dims, payload):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def npy_bytes(descr, shape, payload):
    # Python's repr of the tuple, as numpy writes it: "(5,)" or "(5, 28, 28)".
    shape_text = f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(str(d) for d in shape) + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}"
    # numpy pads with spaces and a newline so the data starts on a 64-byte boundary (format 1.0).
    pad = -(10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("ascii") + payload


def label_payload(labels, descr):
    order = {"<": "<", ">": ">", "|": "<"}[descr[0]]
    code = {("i", "1"): "b", ("u", "1"): "B", ("i", "2"): "h", ("u", "2"): "H", ("i", "4"): "i",
            ("u", "4"): "I", ("i", "8"): "q", ("u", "8"): "Q"}[(descr[1], descr[2:])]
    return struct.pack(f"{order}{len(labels)}{code}", *labels)


def cifar_record_pixels(img, rows, cols):
    # H x W x C -> the R, G and B planes of a CIFAR record.
    return b"".join(img[c::3] for c in range(3))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("--format", required=True, choices=["idx", "cifar10", "cifar100", "npy"])
    p.add_argument("--gzip", action="store_true", help="idx only: write the files gzip'd")
    p.add_argument("--train", type=int, default=100)
    p.add_argument("--test", type=int, default=50)
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--cols", type=int, default=None)
    p.add_argument("--channels", type=int, default=None)
    p.add_argument("--classes", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--learnable", action="store_true")
    p.add_argument("--npy-4d", action="store_true", help="npy: write N x H x W x 1 when C == 1")
    p.add_argument("--levels-seed", type=int, default=None,
                   help="seed of the classes' colour levels (default: --seed)")
    p.add_argument("--relabel", type=int, default=None,
                   help="write class k as k mod K2 (images drawn for the --classes classes)")
    p.add_argument("--label-dtype", default="|u1",
                   help="npy: the labels' dtype, e.g. '<i8' (default '|u1')")
    a = p.parse_args()

    cifar = a.format.startswith("cifar")
    rows = a.rows if a.rows is not None else (32 if cifar else 28)
    cols = a.cols if a.cols is not None else (32 if cifar else 28)
    channels = a.channels if a.channels is not None else (3 if cifar else 1)
    classes = a.classes if a.classes is not None else (100 if a.format == "cifar100" else 10)
    if cifar and (rows, cols, channels) != (32, 32, 3):
        sys.exit(f"make_data.py: {a.format} images are 32x32x3, not {rows}x{cols}x{channels}")
    limit = {"cifar10": 10, "cifar100": 100}.get(a.format, 256)
    if not 1 <= classes <= limit:
        sys.exit(f"make_data.py: --classes {classes} is outside 1..{limit} for {a.format}")
    if min(rows, cols, channels, a.train, a.test) < 1:
        sys.exit("make_data.py: --rows, --cols, --channels, --train and --test must be >= 1")
    if a.gzip and a.format != "idx":
        sys.exit("make_data.py: --gzip is for the idx format only")
    if a.label_dtype[0] not in "<>|" or a.label_dtype[1] not in "iu" or a.label_dtype[2:] not in ("1", "2", "4", "8"):
        sys.exit(f"make_data.py: --label-dtype {a.label_dtype}: expected e.g. '|u1', '<i8', '>u2'")

    if a.relabel is not None and not 1 <= a.relabel <= classes:
        sys.exit(f"make_data.py: --relabel {a.relabel} is outside 1..{classes} (--classes)")
    rng = random.Random(a.seed)
    levels = make_levels(channels, classes, a.seed if a.levels_seed is None else a.levels_seed)
    train = make_split(rng, a.train, classes, True, rows, cols, channels, a.learnable, levels)
    test = make_split(rng, a.test, classes, False, rows, cols, channels, a.learnable, levels)
    if a.relabel is not None:
        train, test = [(images, [k % a.relabel for k in labels]) for images, labels in (train, test)]
    os.makedirs(a.dir, exist_ok=True)
    d = a.dir

    if a.format == "idx":
        kind = "idx3" if channels == 1 else "idx4"
        for split, (images, labels) in (("train", train), ("t10k", test)):
            dims = [len(images), rows, cols] + ([channels] if channels > 1 else [])
            write(os.path.join(d, f"{split}-images-{kind}-ubyte"), idx_bytes(dims, b"".join(images)), a.gzip)
            write(os.path.join(d, f"{split}-labels-idx1-ubyte"), idx_bytes([len(labels)], bytes(labels)), a.gzip)
    elif cifar:
        names = ("data_batch_1.bin", "test_batch.bin") if a.format == "cifar10" else ("train.bin", "test.bin")
        for name, (images, labels) in zip(names, (train, test)):
            out = bytearray()
            for img, k in zip(images, labels):
                out += bytes([k]) if a.format == "cifar10" else bytes([k // 5, k])
                out += cifar_record_pixels(img, rows, cols)
            write(os.path.join(d, name), bytes(out))
    else:
        for split, (images, labels) in (("train", train), ("test", test)):
            shape = [len(images), rows, cols] + ([channels] if channels > 1 or a.npy_4d else [])
            write(os.path.join(d, f"{split}_images.npy"), npy_bytes("|u1", shape, b"".join(images)))
            write(os.path.join(d, f"{split}_labels.npy"),
                  npy_bytes(a.label_dtype, [len(labels)], label_payload(labels, a.label_dtype)))


if __name__ == "__main__":
    main()
