#!/usr/bin/env python3
"""Writes Fashion-MNIST (Debian's dataset-fashion-mnist) as a dataset ShardMix serves.

    /usr/bin/python3 examples/fashion_mnist_to_shardmix.py OUT [--source DIR]

OUT/train/<class>/<index>.u8: one file per training image, its 784 raw bytes (28 x 28,
uint8, row-major), in the "folder" layout (label = index of the class folder: the folders
are named 0..9, so the label is the Fashion-MNIST class). The catalog orders samples by
class folder, then file name, so sample ids are class-sorted: with
dataset.placement = "sorted" each node caches contiguous runs of ids, i.e. whole classes
(4 nodes: 2.5 classes each), the worst case for a local shuffle (docs/shuffle-quality.md).
The test set is not converted: the trainer reads it directly (load_idx below).
Idempotent: an OUT with the complete tree is left alone.
"""
import argparse
import gzip
import os
import struct
import sys

import numpy as np

SOURCE = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def load_idx(path):
    """An IDX file (gzip) as a numpy array: images [n, 28, 28] uint8 or labels [n] uint8."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_split(source, split):
    prefix = "train" if split == "train" else "t10k"
    images = load_idx(os.path.join(source, f"{prefix}-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(source, f"{prefix}-labels-idx1-ubyte.gz"))
    if len(images) != len(labels):
        raise ValueError(f"{split}: {len(images)} images but {len(labels)} labels")
    return images, labels


def convert(out, source=SOURCE):
    images, labels = load_split(source, "train")
    root = os.path.join(out, "train")
    marker = os.path.join(out, ".complete")
    if os.path.exists(marker):
        return root, len(images)
    for c in range(10):
        os.makedirs(os.path.join(root, str(c)), exist_ok=True)
    for i, (img, lab) in enumerate(zip(images, labels)):
        with open(os.path.join(root, str(int(lab)), f"{i:05d}.u8"), "wb") as f:
            f.write(img.tobytes())
    with open(marker, "w") as f:
        f.write(f"{len(images)} training images from {source}\n")
    return root, len(images)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--source", default=SOURCE)
    args = ap.parse_args()
    root, n = convert(args.out, args.source)
    print(f"{n} training images in {root} (10 class folders, 784 bytes each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
