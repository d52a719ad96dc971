#!/usr/bin/env python3
"""Reference for GPT dataset indices, written from Megatron-LM's algorithms with numpy.

Independent of the C++ code under test: it reads the .idx file itself and rebuilds, with numpy's
RandomState and plain Python loops, what megatron/core/datasets/{gpt_dataset.py, helpers.cpp,
blended_dataset.py, blended_megatron_dataset_builder.py} build. Results go to OUT as .npy files:

  {split}-document_index.npy / sample_index.npy / shuffle_index.npy      (one prefix)
  {split}-{d}-document_index.npy ... and {split}-dataset_index.npy,
  {split}-dataset_sample_index.npy                                      (a weighted blend)
  mock_lengths.npy                                                       (--mock)

usage: gpt_reference.py --out DIR --seq-length S --seed N --sizes a,b,c
                        (--prefix P --split "969,30,1" | --blend "0.3 P1 0.7 P2" --split ... | --mock)
"""
import argparse
import math
import os
import re
import struct

import numpy


def read_lengths(prefix):
    with open(prefix + ".idx", "rb") as f:
        data = f.read()
    assert data[:9] == b"MMIDIDX\x00\x00"
    n, _ = struct.unpack("<QQ", data[18:34])
    return numpy.frombuffer(data, dtype=numpy.int32, count=n, offset=34).copy()


def normalize(w):
    w = numpy.array(w, dtype=numpy.float64)
    return (w / numpy.sum(w)).tolist()


def split_matrix(split):
    v = list(map(float, re.findall(r"[.0-9]+", split)))
    v = v + [0.0] * (3 - len(v))
    v = normalize(v)
    ends = [0]
    for x in v:
        ends.append(ends[-1] + x)
    return [None if b <= a else (a, b) for a, b in zip(ends[:-1], ends[1:])]


def num_epochs(tokens_per_epoch, num_samples, seq_length):
    if num_samples is None:
        return 1
    epochs, tokens = 1, tokens_per_epoch
    while tokens < num_samples * seq_length + 1:
        epochs += 1
        tokens += tokens_per_epoch
    return epochs


def document_index(docs, epochs, rng, separate):
    if not separate or epochs == 1:
        idx = numpy.mgrid[0:epochs, 0:len(docs)][1]
        idx[:] = docs
        idx = idx.reshape(-1).astype(numpy.int32)
        rng.shuffle(idx)
        return idx
    first = document_index(docs, epochs - 1, rng, False)
    last = document_index(docs, 1, rng, False)
    return numpy.concatenate((first, last))


def sample_index(sizes, doc_idx, seq_length, epochs, tokens_per_epoch):
    num_samples = (epochs * tokens_per_epoch - 1) // seq_length
    out = numpy.zeros((num_samples + 1, 2), dtype=numpy.int64)
    i, doc_i, off = 1, 0, 0
    while i <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            length = int(sizes[doc_idx[doc_i]]) - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - 1
                remaining = 0
            else:
                if doc_i == len(doc_idx) - 1:
                    off = int(sizes[doc_idx[doc_i]]) - 1
                    break
                doc_i += 1
                off = 0
        out[i] = (doc_i, off)
        i += 1
    if max(len(doc_idx), int(sizes.max())) <= numpy.iinfo(numpy.int32).max:
        out = out.astype(numpy.int32)
    return out


def shuffle_index(num_samples, total, rng):
    dtype = numpy.uint32 if total < numpy.iinfo(numpy.uint32).max - 1 else numpy.int64
    first = numpy.arange(0, num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total:
        return first
    last = numpy.arange(num_samples, total, dtype=dtype)
    rng.shuffle(last)
    return numpy.concatenate((first, last))


def gpt_indices(sizes, begin, end, num_samples, seq_length, seed):
    docs = numpy.arange(begin, end, dtype=numpy.int32)
    tpe = int(numpy.sum(sizes[docs]))
    epochs = num_epochs(tpe, num_samples, seq_length)
    separate = False
    if epochs > 1:
        sans = ((epochs - 1) * tpe - 1) // seq_length
        per_epoch = (tpe - 1) // seq_length
        separate = num_samples - sans < int(0.80 * per_epoch)
    rng = numpy.random.RandomState(seed)
    d = document_index(docs, epochs, rng, separate)
    s = sample_index(sizes, d, seq_length, epochs, tpe)
    total = s.shape[0] - 1
    h = shuffle_index(sans if separate else total, total, rng)
    return d, s, h


def blending(weights, size):
    dataset_index = numpy.zeros(size, dtype=numpy.int16)
    sample_index = numpy.zeros(size, dtype=numpy.int64)
    current = [0] * len(weights)
    for i in range(size):
        x = max(float(i), 1.0)
        best, best_err = 0, weights[0] * x - current[0]
        for d in range(1, len(weights)):
            err = weights[d] * x - current[d]
            if err > best_err:
                best, best_err = d, err
        dataset_index[i] = best
        sample_index[i] = current[best]
        current[best] += 1
    return dataset_index, sample_index


def save(out, name, arr):
    numpy.save(os.path.join(out, name), arr, allow_pickle=False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--sizes", default="0,0,0")
    p.add_argument("--split", default="969,30,1")
    p.add_argument("--prefix")
    p.add_argument("--blend")
    p.add_argument("--mock", action="store_true")
    a = p.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    names = ["train", "valid", "test"]

    if a.mock:
        rng = numpy.random.default_rng(seed=0)
        lengths = rng.integers(low=1, high=4096, size=100000, dtype=numpy.int32)
        save(a.out, "mock_lengths.npy", lengths)
        for i, bookend in enumerate(split_matrix("1,1,1")):
            beg, end = int(round(bookend[0] * 100000.0)), int(round(bookend[1] * 100000.0))
            d, s, h = gpt_indices(lengths, beg, end, sizes[i], a.seq_length, a.seed)
            save(a.out, f"{names[i]}-document_index.npy", d)
            save(a.out, f"{names[i]}-sample_index.npy", s)
            save(a.out, f"{names[i]}-shuffle_index.npy", h)
        return

    matrix = split_matrix(a.split)
    if a.prefix:
        lengths = read_lengths(a.prefix)
        for i, bookend in enumerate(matrix):
            if bookend is None:
                continue
            beg = int(round(bookend[0] * float(len(lengths))))
            end = int(round(bookend[1] * float(len(lengths))))
            d, s, h = gpt_indices(lengths, beg, end, sizes[i], a.seq_length, a.seed)
            save(a.out, f"{names[i]}-document_index.npy", d)
            save(a.out, f"{names[i]}-sample_index.npy", s)
            save(a.out, f"{names[i]}-shuffle_index.npy", h)
        return

    items = a.blend.split()
    weights = normalize([float(x) for x in items[0::2]])
    prefixes = items[1::2]
    for i, bookend in enumerate(matrix):
        if bookend is None:
            continue
        target = [int(math.ceil(sizes[i] * w)) for w in weights]
        buffer = [int(math.ceil(math.ceil(sizes[i] * w) * (1 + 0.005))) for w in weights]
        for dd, prefix in enumerate(prefixes):
            lengths = read_lengths(prefix)
            beg = int(round(bookend[0] * float(len(lengths))))
            end = int(round(bookend[1] * float(len(lengths))))
            d, s, h = gpt_indices(lengths, beg, end, buffer[dd], a.seq_length, a.seed)
            save(a.out, f"{names[i]}-{dd}-document_index.npy", d)
            save(a.out, f"{names[i]}-{dd}-sample_index.npy", s)
            save(a.out, f"{names[i]}-{dd}-shuffle_index.npy", h)
        di, si = blending(normalize(weights), sum(target))
        save(a.out, f"{names[i]}-dataset_index.npy", di)
        save(a.out, f"{names[i]}-dataset_sample_index.npy", si)


if __name__ == "__main__":
    main()
