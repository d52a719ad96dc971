#!/usr/bin/env python3
"""Reference for `megatron preprocess` with --tokenizer-type NullTokenizer (Python stdlib only).

Follows tools/preprocess_data.py and megatron/core/datasets/indexed_dataset.py: each JSON line
is a document; each key's value (a string, or a list of sentence strings) is tokenized, empty
sentences are dropped, --append-eod adds the EOD id to a non-empty document; with --partitions N
(and no --keep-sequential-samples) lines are dealt round-robin to N partitions whose outputs are
concatenated. The .bin/.idx bytes are written here with struct, independently of the C++ writer.

usage: preprocess_reference.py --input PATH... --output-prefix P --vocab-size N
           [--json-keys K...] [--append-eod] [--partitions N] [--keep-sequential-samples]
"""
import argparse
import glob
import gzip
import json
import struct


def dtype_for(vocab_size):
    # DType.optimal_dtype: uint16 (code 8) below 65500 ids, else int32 (code 4)
    return (8, "<H", 2) if vocab_size < 65500 else (4, "<i", 4)


def write_dataset(prefix, docs, vocab_size):
    """docs: list of documents, each a list of sequences (lists of ids)."""
    code, fmt, size = dtype_for(vocab_size)
    lengths, pointers, bounds = [], [], [0]
    ptr = 0
    with open(prefix + ".bin", "wb") as b:
        for doc in docs:
            for seq in doc:
                b.write(b"".join(struct.pack(fmt, t) for t in seq))
                lengths.append(len(seq))
                pointers.append(ptr)
                ptr += len(seq) * size
            bounds.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(bounds)))
        f.write(struct.pack("<%di" % len(lengths), *lengths))
        f.write(struct.pack("<%dq" % len(pointers), *pointers))
        f.write(struct.pack("<%dq" % len(bounds), *bounds))


def read_lines(patterns):
    files = []
    for p in patterns:
        files.extend(sorted(glob.glob(p)) if any(c in p for c in "*?[") else [p])
    for name in files:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(name, "rt", encoding="utf-8") as f:
            for line in f:
                yield line


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--append-eod", action="store_true")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--keep-sequential-samples", action="store_true")
    a = p.parse_args()
    vocab = a.vocab_size + 1  # NullTokenizer: EOD is the id after the vocabulary
    eod = a.vocab_size

    parts = a.partitions if a.partitions > 1 and not a.keep_sequential_samples else 1
    docs = {k: [[] for _ in range(parts)] for k in a.json_keys}
    for i, line in enumerate(read_lines(a.input)):
        data = json.loads(line)
        for key in a.json_keys:
            text = data[key]
            sentences = text if isinstance(text, list) else [text]
            doc = [[int(x) for x in s.split()] for s in sentences]
            doc = [s for s in doc if s]
            if doc and a.append_eod:
                doc[-1].append(eod)
            docs[key][i % parts].append(doc)
    for key in a.json_keys:
        ordered = [d for part in docs[key] for d in part]
        write_dataset("%s_%s_document" % (a.output_prefix, key), ordered, vocab)


if __name__ == "__main__":
    main()
