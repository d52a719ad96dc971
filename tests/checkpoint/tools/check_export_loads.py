"""Run on a machine with HF transformers (the GPU machine): every fixture goes HF -> megatron.cpp
-> HF through `megatron convert`, in both config.json styles, and the exported directory must load
with transformers' AutoModelForCausalLM and give the fixture's reference logits.
usage: python3 check_export_loads.py MEGATRON_BINARY FIXTURES_DIR WORK_DIR"""
import json, os, subprocess, sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

megatron, fixtures, work = sys.argv[1:4]
failures = 0
for arch in sorted(os.listdir(fixtures)):
    src = os.path.join(fixtures, arch)
    if not os.path.isfile(os.path.join(src, "config.json")):
        continue
    ids = np.load(os.path.join(src, "input_ids.npy"))
    ref = np.load(os.path.join(src, "logits.npy"))
    for style in ("4", "5"):
        ck, out = os.path.join(work, arch + "_ck"), os.path.join(work, f"{arch}_hf{style}")
        subprocess.run([megatron, "convert", "--from", "hf", "--input", src, "--output", ck], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([megatron, "convert", "--from", "megatron", "--to", "hf", "--input", ck, "--output", out,
                        "--dtype", "fp32", "--hf-config-style", style], check=True, stdout=subprocess.DEVNULL)
        model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            got = model(torch.from_numpy(ids.astype(np.int64))).logits.float().numpy()
        rel = float(np.abs(got - ref).max() / (np.abs(ref).max() + 1e-12))
        ok = got.shape == ref.shape and rel < 1e-4
        failures += not ok
        print(f"{arch:8s} config style {style}: loads in transformers, logits max rel diff {rel:.2e} "
              f"{'PASS' if ok else 'FAIL'} ({json.load(open(os.path.join(out, 'config.json'))).get('model_type')})")
        subprocess.run(["rm", "-rf", ck, out])
print(f"{failures} failed")
sys.exit(1 if failures else 0)
