#!/usr/bin/env python3
"""Expected greedy tokens from transformers' generate() for the repo's HF fixtures, for the
engine's parity test (tests/inference/hf_parity_test.cpp).

Run on a machine with torch + transformers (no network, no GPU needed; fp32 on the CPU so the
reference is exact):
    python3 tests/tools/hf_generate_fixture.py [--out tests/inference/fixtures/hf_greedy.json]
then commit the output file. For every fixture directory under tests/checkpoint/fixtures that holds
a config.json and input_ids.npy, each row of input_ids.npy is continued by MAX_NEW greedy tokens
with generate(do_sample=False), end-of-sequence stopping switched off (the engine's test asks for
exactly MAX_NEW tokens). A plain argmax loop over full forwards checks generate's answer; a
mismatch is reported and the model left out rather than written.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers

MAX_NEW = 16
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "tests", "checkpoint", "fixtures")


def manual_greedy(model, ids, n):
    ids = ids.clone()
    out = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
        t = int(torch.argmax(logits))
        out.append(t)
        ids = torch.cat([ids, torch.tensor([[t]], device=ids.device)], dim=1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "inference", "fixtures", "hf_greedy.json"))
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    models = {}
    failed = []
    for name in sorted(os.listdir(FIXTURES)):
        d = os.path.join(FIXTURES, name)
        if not (os.path.isfile(os.path.join(d, "config.json")) and os.path.isfile(os.path.join(d, "input_ids.npy"))):
            continue
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        model = model.to(args.device).eval()
        model.generation_config.eos_token_id = None  # exactly MAX_NEW tokens
        model.generation_config.pad_token_id = 0
        ids = np.load(os.path.join(d, "input_ids.npy")).astype(np.int64)
        prompts, greedy = [], []
        ok = True
        for row in ids:
            x = torch.tensor(row[None, :], device=args.device)
            with torch.no_grad():
                g = model.generate(x, max_new_tokens=MAX_NEW, do_sample=False, num_beams=1,
                                   attention_mask=torch.ones_like(x))
            gen = [int(t) for t in g[0, x.shape[1]:]]
            check = manual_greedy(model, x, MAX_NEW)
            if gen != check:
                print(f"{name}: generate() {gen} differs from the argmax loop {check}; left out", file=sys.stderr)
                ok = False
                break
            prompts.append([int(t) for t in row])
            greedy.append(gen)
        if ok:
            models[name] = {"input_ids": prompts, "greedy": greedy}
            print(f"{name}: {len(greedy)} prompts x {MAX_NEW} tokens")
        else:
            failed.append(name)
    doc = {
        "comment": "transformers generate(do_sample=False), fp32, eos stopping off; made by tests/tools/hf_generate_fixture.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "max_new_tokens": MAX_NEW,
        "models": models,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out} ({len(models)} models{', left out: ' + ', '.join(failed) if failed else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
