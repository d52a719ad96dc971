#!/usr/bin/env python3
"""Checks a torch_dist checkpoint written by megatron.cpp on the Python side (a machine with torch).

1. Always: PyTorch's own distributed-checkpoint reader loads every tensor and object of it
   (torch.distributed.checkpoint, no process group), and the tensors are finite.
2. With --megatron SRC (a source tree of Megatron-LM, e.g. `git -C MIRROR archive d98e8a6 | tar -x`,
   the commit the fixtures were made with; it needs only torch): Megatron-LM's pretrain_gpt.py
   resumes from it on one GPU with the fixture README's flags and trains to --exit-interval; its
   logged lm loss for the iterations after the checkpoint must match --expect (lines "ITER LOSS",
   what megatron.cpp printed resuming from the same checkpoint) within --rtol.
3. With --reference DIR (Megatron's own checkpoint of the same run and iteration, e.g. the
   fixture ck_dist): Megatron resumes from that one too, with the same command, and the two
   resumed runs must log the same losses within --rtol. This is the exact question (does Megatron
   treat our checkpoint as its own?) and holds even where Megatron's resumed losses differ from
   its uninterrupted run's.

Example (from the repository root, after building):
  build/bin/megatron convert --from megatron-torch --to megatron-torch-dist \\
      --input tests/fixtures/megatron_ckpt/ck_torch --output /tmp/back
  python3 tests/tools/check_torch_dist_in_megatron.py /tmp/back \\
      --megatron /tmp/Megatron-LM --expect tests/fixtures/megatron_ckpt/ck_torch.losses_1_10
Prints one JSON line per check; exits non-zero on the first failure.
"""
import argparse
import io
import json
import math
import os
import re
import subprocess
import sys

README_FLAGS = """
--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
--ffn-hidden-size 128 --seq-length 64 --max-position-embeddings 64 --normalization RMSNorm --swiglu
--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
--attention-dropout 0 --hidden-dropout 0 --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --min-lr 1e-4
--lr-decay-style cosine --lr-warmup-iters 2 --lr-decay-iters 20 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
--split 98,2,0 --tokenizer-type NullTokenizer --vocab-size 511
--log-interval 1 --eval-iters 0 --eval-interval 1000 --train-iters 15 --exit-interval 10
--no-gradient-accumulation-fusion --no-rope-fusion --no-masked-softmax-fusion --no-persist-layer-norm
--transformer-impl local
""".split()


def report(**kw):
    print(json.dumps(kw), flush=True)


def load_with_dcp(ckpt):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    it = open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip()
    d = os.path.join(ckpt, f"iter_{int(it):07d}")
    reader = dcp.FileSystemReader(d)
    md = reader.read_metadata()
    sd = {}
    for k, v in md.state_dict_metadata.items():
        sd[k] = io.BytesIO() if isinstance(v, BytesStorageMetadata) else torch.empty(v.size, dtype=v.properties.dtype)
    dcp.load(sd, storage_reader=reader, no_dist=True)
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    bad = [k for k, v in tensors.items() if not torch.isfinite(v).all()]
    common = torch.load(sd["common_state/shard_0_1"], weights_only=False) if isinstance(
        sd.get("common_state/shard_0_1"), io.BytesIO) else None
    if isinstance(common, list):
        common = common[0]
    report(check="dcp_load", ok=not bad, tensors=len(tensors), objects=len(sd) - len(tensors),
           non_finite=bad[:5], iteration=common.get("iteration") if isinstance(common, dict) else None)
    return not bad, int(it)


def run_megatron(ckpt, src, data_prefix):
    """Megatron-LM resuming from ckpt: (return code, {iteration: lm loss}, stdout)."""
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_DEVICE_MAX_CONNECTIONS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
           os.path.join(src, "pretrain_gpt.py"), *README_FLAGS, "--data-path", data_prefix,
           "--load", ckpt, "--ckpt-format", "torch_dist"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    got = {int(m.group(1)): float(m.group(2))
           for m in re.finditer(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.E+-]+)", p.stdout)}
    return p.returncode, got, p.stdout


def compare(check, rc, got, want, rtol, stdout):
    worst = max((abs(got[i] - w) / abs(w) for i, w in want.items() if i in got), default=math.inf)
    ok = rc == 0 and bool(want) and set(want) <= set(got) and worst <= rtol
    report(check=check, ok=ok, rc=rc, losses=got, expected=want, max_rel_diff=worst)
    if not ok:
        sys.stdout.write(stdout[-4000:])
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="the directory megatron.cpp saved (holding latest_checkpointed_iteration.txt)")
    ap.add_argument("--megatron", help="Megatron-LM source tree (commit d98e8a6)")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data-prefix", default=os.path.join(here, "..", "fixtures", "megatron_ckpt", "data",
                                                          "fix_text_document"))
    ap.add_argument("--expect", help="ITER LOSS lines megatron.cpp printed resuming from the checkpoint")
    ap.add_argument("--reference", help="Megatron's own torch_dist checkpoint of the same run and iteration")
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    if a.megatron:
        # The checkpoint's pickled objects name Megatron's classes (as Megatron's own do), so the
        # reader needs its source importable too.
        sys.path.insert(0, os.path.abspath(a.megatron))
    ok, iteration = load_with_dcp(a.checkpoint)
    if not ok:
        return 1
    if a.megatron:
        if not a.expect:
            ap.error("--megatron needs --expect")
        rc, got, out = run_megatron(os.path.abspath(a.checkpoint), a.megatron, os.path.abspath(a.data_prefix))
        want = {}
        for line in open(a.expect):
            parts = line.split()
            if len(parts) == 2 and int(parts[0]) > iteration:
                want[int(parts[0])] = float(parts[1])
        # Against the uninterrupted run: reported; it decides only without --reference.
        ok = compare("megatron_resume", rc, got, want, a.rtol, out)
        if a.reference:
            ref_rc, ref, ref_out = run_megatron(os.path.abspath(a.reference), a.megatron, os.path.abspath(a.data_prefix))
            report(check="megatron_resume_own", ok=ref_rc == 0, rc=ref_rc, losses=ref)
            if ref_rc != 0:
                sys.stdout.write(ref_out[-4000:])
                return 1
            ok = compare("megatron_resume_matches_own", rc, got, {i: v for i, v in ref.items() if i > iteration},
                         a.rtol, out)
        if not ok:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
