#!/usr/bin/env python3
"""Reads megatron.cpp's TensorBoard event files with TensorBoard's own reader (EventAccumulator)
and checks them against the same run's --metrics-jsonl file.

usage:
  read_tb_events.py --megatron build/bin/megatron     # trains a tiny CPU run, then checks it
  read_tb_events.py --logdir DIR --jsonl FILE         # checks an existing run

Prints every tag with its (step, value) pairs, then checks: the tags Megatron writes are there
(learning-rate, batch-size, lm loss, loss-scale, grad-norm, num-zeros, params-norm,
iteration-time, throughput, lm loss validation, lm loss validation ppl, a timer), and every value
in the JSON lines (grad norm, params norm, validation loss) equals TensorBoard's at that step, as
a float32. Exits 1 on any mismatch or missing tag. Needs the `tensorboard` Python package.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

REQUIRED = ["learning-rate", "batch-size", "lm loss", "loss-scale", "grad-norm", "num-zeros", "params-norm",
            "iteration-time", "throughput", "lm loss validation", "lm loss validation ppl", "forward-backward-time",
            "lm loss vs samples"]


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def train(megatron, out):
    cmd = [megatron, "pretrain", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
           "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
           "--global-batch-size", "4", "--lr", "0.003", "--mock-data", "--vocab-size", "100", "--train-iters", "6",
           "--log-interval", "2", "--eval-interval", "3", "--eval-iters", "1", "--device", "cpu",
           "--no-progress-bar", "--data-cache-path", os.path.join(out, "cache"),
           "--tensorboard-dir", os.path.join(out, "tb"), "--metrics-jsonl", os.path.join(out, "m.jsonl"),
           "--log-params-norm", "--log-num-zeros-in-grad", "--log-throughput", "--log-timers-to-tensorboard",
           "--log-validation-ppl-to-tensorboard", "--timing-log-level", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        sys.exit(f"megatron exited {r.returncode}")
    return os.path.join(out, "tb"), os.path.join(out, "m.jsonl")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megatron")
    ap.add_argument("--logdir")
    ap.add_argument("--jsonl")
    a = ap.parse_args()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp = tempfile.TemporaryDirectory()
    if a.megatron:
        logdir, jsonl = train(a.megatron, tmp.name)
    elif a.logdir and a.jsonl:
        logdir, jsonl = a.logdir, a.jsonl
    else:
        ap.error("give --megatron BIN, or --logdir DIR and --jsonl FILE")

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    values = {t: {e.step: e.value for e in acc.Scalars(t)} for t in tags}
    for t in sorted(tags):
        print(f"{t}: " + ", ".join(f"({s}, {v:.6g})" for s, v in sorted(values[t].items())))

    bad = [f"missing tag {t!r}" for t in REQUIRED if t not in values]

    def same(tag, step, want, what):
        got = values.get(tag, {}).get(step)
        if got is None:
            bad.append(f"{tag} has no value at step {step} ({what} {want})")
        elif got != f32(want):
            bad.append(f"{tag} at step {step}: TensorBoard {got!r}, JSON lines {f32(want)!r}")

    n = 0
    for line in open(jsonl):
        o = json.loads(line)
        it = o["iteration"]
        if o["type"] == "train":
            n += 1
            if o.get("grad_norm") is not None:
                same("grad-norm", it, o["grad_norm"], "grad_norm")
            if o.get("params_norm") is not None:
                same("params-norm", it, o["params_norm"], "params_norm")
            same("learning-rate", it, o["learning_rate"], "learning_rate")
            same("iteration-time", it, o["iteration_time_s"], "iteration_time_s")
        elif o["type"] == "validation":
            same("lm loss validation", it, o["lm_loss"], "lm_loss")
    if n == 0:
        bad.append("no train lines in the JSON lines file")
    for b in bad:
        print("MISMATCH:", b)
    print(f"{len(tags)} tags, {n} log lines checked: {'FAIL' if bad else 'OK'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
