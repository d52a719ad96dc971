#!/usr/bin/env python3
"""HF transformers' generate() on the llama-1.5b shape (Llama-3.2-1B, untied head), random bf16
weights, on the GPU: the anchor bench/gpu_generate_bench.sh prints beside megatron.cpp's engine.
JSON lines: decode_batch1 (tokens/s, static cache where this transformers has it), decode_batchN
(generated tokens/s, prefill included), ttft_2048 (ms to the first token of a 2,048-token prompt).
"""
import argparse
import json
import time

import torch
import transformers

ap = argparse.ArgumentParser()
ap.add_argument("--prompt", type=int, default=128)
ap.add_argument("--new", type=int, default=256)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--ttft-prompt", type=int, default=2048)
ap.add_argument("--layers", type=int, default=16)
# transformers' default dynamic cache (what generate() does unless told); "static" compiles the
# decode step with torch.compile first, which took longer than the bench's 130 s slot on an H100
# (session 12), and falls back to dynamic where unsupported.
ap.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
args = ap.parse_args()

cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                               num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
                               max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False,
                               rms_norm_eps=1e-5)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0


def gen(batch, prompt, new, static):
    ids = torch.randint(0, 128000, (batch, prompt), device="cuda")
    kw = dict(max_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(ids))
    if static:
        kw["cache_implementation"] = "static"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def timed(batch, prompt, new):
    """Seconds for `new` tokens; static cache where supported, else the default dynamic one."""
    for static in ((True, False) if args.cache == "static" else (False,)):
        try:
            gen(batch, prompt, 4, static)  # warm-up
            return gen(batch, prompt, new, static), static
        except Exception as e:  # an older transformers without static caches for this call
            err = e
    raise err


out = {"impl": "hf-transformers", "transformers": transformers.__version__, "torch": torch.__version__,
       "device": torch.cuda.get_device_name(0)}
# Batch 1: the decode rate from two lengths (prefill and fixed costs cancel).
t_long, static = timed(1, args.prompt, args.new)
t_short, _ = timed(1, args.prompt, 1)
print(json.dumps({**out, "bench": "decode_batch1", "prompt": args.prompt, "new_tokens": args.new,
                  "static_cache": static, "tokens_per_s": (args.new - 1) / (t_long - t_short)}), flush=True)
t, static = timed(args.batch, args.prompt, args.new)
print(json.dumps({**out, "bench": f"decode_batch{args.batch}", "prompt": args.prompt, "new_tokens": args.new,
                  "static_cache": static, "tokens_per_s_with_prefill": args.batch * args.new / t}), flush=True)
t, static = timed(1, args.ttft_prompt, 1)
print(json.dumps({**out, "bench": f"ttft_{args.ttft_prompt}", "static_cache": static, "ms": 1e3 * t}), flush=True)
