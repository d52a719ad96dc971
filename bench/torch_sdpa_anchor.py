"""Attention anchor for bench/gpu_longseq_bench.sh: torch's scaled_dot_product_attention at
llama-1.5b's head shape (32 query heads, 8 key/value heads, head dim 64), bf16, causal, batch 1,
one sequence of --seq tokens, forward and forward+backward, with the flash and the cuDNN
backends (and FlashAttention-3's flash_attn_interface when installed). FLOPs are counted as
cuda_ops_bench counts them: forward 4*H*S*S*D/2 (causal), backward 2.5x the forward. Prints one
JSON line per backend: {"anchor": ..., "fwd_ms", "fwd_bwd_ms", "fwd_bwd_tflops"} or an "error"."""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, HKV, D = 32, 8, 64


def timed(fn, iters):
    for _ in range(2):  # warm-up: kernel selection, workspace
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    S = args.seq
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
    # Key/value heads repeated to the query heads: every backend takes that layout (enable_gqa
    # is not served by all of them); the FLOPs are the same as GQA's.
    k0 = torch.randn(1, HKV, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    v0 = torch.randn(1, HKV, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    k = k0.repeat_interleave(H // HKV, dim=1).detach().requires_grad_()
    v = v0.repeat_interleave(H // HKV, dim=1).detach().requires_grad_()
    dout = torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, generator=g)
    fwd_flop = 4.0 * H * S * S * D / 2.0
    total_flop = fwd_flop * 3.5
    shape = f"B1 H{H} Hkv{HKV} S{S} D{D} causal"

    def run(name, attn):
        try:
            def fwd():
                with torch.no_grad():
                    attn(q, k, v)

            def fwd_bwd():
                q.grad = k.grad = v.grad = None
                attn(q, k, v).backward(dout)

            f = timed(fwd, args.iters)
            fb = timed(fwd_bwd, args.iters)
            print(json.dumps({"anchor": name, "shape": shape, "torch": torch.__version__, "fwd_ms": round(f, 3),
                              "fwd_bwd_ms": round(fb, 3), "fwd_tflops": round(fwd_flop / f * 1e-9, 1),
                              "fwd_bwd_tflops": round(total_flop / fb * 1e-9, 1)}), flush=True)
        except Exception as e:  # a backend this build or GPU does not serve
            print(json.dumps({"anchor": name, "shape": shape, "error": str(e).splitlines()[0][:200]}), flush=True)

    for name, backend in (("torch_sdpa_flash", SDPBackend.FLASH_ATTENTION),
                          ("torch_sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        def attn(q, k, v, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        run(name, attn)
    try:
        import flash_attn_interface  # FlashAttention-3 (Hopper), when the image has it

        def fa3(q, k, v):
            out = flash_attn_interface.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       causal=True)
            out = out[0] if isinstance(out, tuple) else out
            return out.transpose(1, 2)
        run("flash_attn_3", fa3)
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
