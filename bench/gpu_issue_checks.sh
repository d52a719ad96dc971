#!/usr/bin/env bash
# One device call for what the open issues still need measured on a GPU (session 12 could not:
# the device time was spent). Parts, in the order given (default: all but conv and dist):
#   build     configure + build every target in $MT_DEVICE_BUILD (/tmp/mt_build)
#   tests     ctest -L gpu (the multi-GPU tests run where 2 GPUs are visible)
#   longseq   #19: llama-1.5b at seq 32k on one GPU (the cuDNN workspace fallback, 9d88511)
#   fp8       #18: bench/gpu_fp8_bench.sh (bf16 / delayed / tensorwise, breakdown)
#   moe       #17: moe-2b at accum 8 without events, and torch_moe.py --impl grouped (anchors carried)
#   moebd     #17: moe-2b at accum 8 with --log-op-breakdown, no anchor (where the time goes)
#   moend     #17: moe-2b at accum 8 with --nondeterministic-attention (Megatron's default), no anchor
#   gen       #22: bench/gpu_generate_bench.sh (device argmax, 24d3d7d) with the HF anchor (dynamic cache)
#   ckpt      #21: a torch_dist checkpoint saved by megatron.cpp resumed by Megatron-LM d98e8a6
#             (scripts/device_prep.sh with MT_PREP_MEGATRON=<Megatron-LM git dir> carries its source)
#   profile   #26: bench/gpu_profile_demo.sh (nsys where present, else ncu over the --profile window)
#   conv      #18: bench/gpu_fp8_convergence.sh (4 x 1,000 steps, a GPU each where there are several;
#             scripts/device_prep.sh with MT_PREP_BROWN=1 carries the corpus)
#   dist      #23: bench/gpu_dist_bench.sh ep,cp,fp8 (2 GPUs)
#   ragged    #19: cuDNN varlen SDPA against the ranged kernels (cuda_ops_bench --only=varlen)
#   genfp8    #22: decode with CUDA graphs at batch 1 / 64, bf16 then FP8 weights (no HF anchor)
#   fp8short  #18: bf16 / tensorwise / blockwise, 8 iterations
#   cp32      #23: CP=2 at 32k only (p2p, or MT_CP_COMMS), with its one-GPU reference at the same batch
#   cp64      #23: CP=2 at 64k only (p2p, or MT_CP_COMMS), with its one-GPU reference at the same batch (MT_CP_ONE_GPU=0: without)
#   epov      #23: moe-2b + shared expert at EP=2, with and without --moe-shared-expert-overlap (2 GPUs)
#   gpu4      #24: the 4-GPU equivalence tests only (DP4, TP4, TP2xPP2, CP2xTP2, EP4, EP2xDP2)
#   dp4 l8b4 l8b4fp8 moe4   #24: bench/gpu_dist_bench.sh's 4-GPU parts (weak scaling, llama-8b layouts, moe-2b EP)
#   dp8 l8b8 l8b8fp8 moe8 big30b   #25: its 8-GPU parts (weak scaling, llama-8b layouts, a 12.7B MoE, a 28.6B Llama)
#   kprof     #22 / #17: bench/gpu_kernel_profile.sh decode moe (ncu kernel times: decode tokens, one MoE step)
#   kprofdec  #22: the decode profile alone, with each kernel per grid (shape): time, DRAM bytes, GB/s
#   gemvchain #22: decode's GEMVs back to back in one CUDA graph, as a decode step runs them (each
#             shape's in-place GB/s; cuda_ops_bench --only=gemvchain)
#   fp8pg     #23: llama-1.5b DP=2 dist-opt bf16 / FP8 / FP8 with --fp8-param-gather (2 GPUs)
#   optests   #18 / #22: the GPU tests of the opt-in paths not yet run on a GPU (FP8 cast switches,
#             decode kernels, the decode graph arena) and of what they replace
#   fp8optin  #18: bf16, tensorwise, and tensorwise with each cast switch flipped from its default
#             (MT_FP8_OPTIN=1 bench/gpu_fp8_bench.sh), 8 iterations
#   fp8tune   #18: the FP8 GPU tests (ctest -L gpu -R 'Fp8|BackendOps|GemmTune': the vector casts vs the
#             CPU, tuned FP8 GEMMs against untuned), cuda_ops_bench --only=fp8cast (each cast kernel
#             in GB/s against the copy rate, both vector kernels) and --only=fp8gemm (tuning off /
#             on, verbose), and bf16 / tensorwise / tensorwise with MT_FP8_GEMM_TUNE=0 / with
#             MT_FP8_WGRAD_OVERLAP=1, 8 iterations, and tensorwise's breakdown (~400 s;
#             MT_FP8_CAST_AB=1 adds a tensorwise run with MT_FP8_CAST_KERNEL=tile, ~50 s more)
#   genopt    #22: the decode ops' GPU tests (ctest -L gpu -R 'Decode|Gemv|InferenceGpu|KvCache':
#             the fusions, both GEMV kernels, the decode kernels, the engine), then batch-1 decode,
#             graphs only: default / default+stack / general / default-fusions / default+gemv-base / default-arena,
#             each with graph_gpu_ms_per_token (the graph alone) and host_gap_ms_per_token, and each
#             graph's node census (kernels, memory nodes, programmatic edges); no HF anchor
#   stack     #22: the whole-stack decode kernel (MT_DECODE_STACK=1): its GPU tests, then batch-1
#             decode, graphs only, every variant, with the stack's phase timers
#             (MT_DECODE_STACK_TIMES=1: us per token per phase and barrier, the decode_stack_phases_us lines)
# Every part's log stays in /tmp/mt_logs; $OUT gets summary.txt and logs.tar.gz (two files: the
# device tool returns at most 8). Run: bash bench/gpu_issue_checks.sh build,tests,longseq,...
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-/tmp/mt_out}; mkdir -p "$FINAL"
export OUT=/tmp/mt_logs MT_DEVICE_BUILD=${MT_DEVICE_BUILD:-/tmp/mt_build} MT_SKIP_BUILD=1
mkdir -p "$OUT"
export MT_COMMIT=${MT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
B=$MT_DEVICE_BUILD
PARTS=${1:-build,tests,longseq,fp8,moe,gen,ckpt,profile}
S="$FINAL/summary.txt"
say() { echo "$*" | tee -a "$S"; }
part() {  # part NAME SECONDS COMMAND...: runs it with a bound, its output kept, its tail summarised
  local name=$1 secs=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  say "== $name: rc $? in $(( $(date +%s) - t0 )) s"
  grep -E '^\{|passed|failed|Failed|error|speedup|breakdown|overlap:|of 2x|scaling|estimated|kernels,|^  +[0-9.]+%|held-out|iteration 1[01] |loss|decode graph at|^  x[0-9]' "$OUT/$name.log" | tail -25 | tee -a "$S"
}
say "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | tr -s ' '), commit $MT_COMMIT"
for p in ${PARTS//,/ }; do
  case $p in
    build) part build 900 bash -c "cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
             -DMT_WERROR=OFF && cmake --build $B -j$(nproc)" ;;
    tests) part tests 600 bash -c "cd $B && ctest -L gpu --output-on-failure" ;;
    longseq) MT_LONGSEQ_SEQS=32768 MT_BENCH_ITERS=4 MT_SKIP_ANCHOR=1 part longseq 400 bash bench/gpu_longseq_bench.sh ;;
    fp8) MT_BENCH_ITERS=12 part fp8 400 bash bench/gpu_fp8_bench.sh ;;
    moe) MT_MOE_ACCUM=8 MT_MOE_BREAKDOWN=0 MT_MOE_IMPLS=grouped MT_BENCH_ITERS=12 part moe 500 bash bench/gpu_moe_bench.sh ;;
    moebd) MT_MOE_ACCUM=8 MT_MOE_BREAKDOWN=1 MT_SKIP_ANCHOR=1 MT_BENCH_ITERS=10 part moebd 300 bash bench/gpu_moe_bench.sh ;;
    moend) MT_MOE_ACCUM=8 MT_MOE_BREAKDOWN=0 MT_SKIP_ANCHOR=1 MT_BENCH_ITERS=12 MT_MOE_EXTRA=--nondeterministic-attention \
             part moend 300 bash bench/gpu_moe_bench.sh ;;
    gen) part gen 400 bash bench/gpu_generate_bench.sh ;;
    ckpt) part ckpt 400 bash -c "
      F=tests/fixtures/megatron_ckpt; T=/tmp/mt_rt; rm -rf \$T; mkdir -p \$T; cp -a \$F/ck_dist \$T/own
      $B/bin/megatron convert --from megatron-torch --to megatron-torch-dist --input \$F/ck_torch --output \$T/back &&
      python3 tests/tools/check_torch_dist_in_megatron.py \$T/back --megatron third_party_carry/megatron_lm \
        --expect \$F/ck_torch.losses_1_10 --reference \$T/own" ;;
    profile) MT_BIN=$B/bin/megatron part profile 300 bash bench/gpu_profile_demo.sh ;;
    conv) MT_CONV_DATA=third_party_carry/brown MT_CONV_GPT2=third_party_carry/gpt2 part conv 1500 bash bench/gpu_fp8_convergence.sh ;;
    dist) MT_RUN_TIMEOUT=300 part dist 1500 bash bench/gpu_dist_bench.sh ep,cp,fp8 ;;
    ragged) part ragged 200 bash -c "timeout 150 $B/bin/cuda_ops_bench --quick --only=varlen 2>&1 | grep -E 'attn_varlen|failed|error'" ;;
    genfp8) MT_GEN_FP8=1 MT_GEN_HF=${MT_GEN_HF:-0} MT_GEN_ARGS="--new 128 --ttft-prompt 0 --graphs-only 1" part genfp8 200 bash bench/gpu_generate_bench.sh ;;
    fp8short) MT_BENCH_ITERS=8 MT_FP8_RECIPES="tensorwise blockwise" part fp8short 300 bash bench/gpu_fp8_bench.sh ;;
    cp32) MT_CP_SEQS=32768 MT_CP_COMMS=${MT_CP_COMMS:-p2p} MT_RUN_TIMEOUT=200 part cp32 400 bash bench/gpu_dist_bench.sh cp ;;
    cp64) MT_CP_SEQS=65536 MT_CP_COMMS=${MT_CP_COMMS:-p2p} MT_CP_ONE_GPU=${MT_CP_ONE_GPU:-1} MT_RUN_TIMEOUT=250 part cp64 400 bash bench/gpu_dist_bench.sh cp ;;
    epov) MT_RUN_TIMEOUT=150 part epov 500 bash bench/gpu_dist_bench.sh epov ;;
    gpu4) part gpu4 300 bash -c "cd $B && ctest -R 'GpuEquivalence\.(DP4|TP4|TP2SequenceParallelxPP2|CP2xTP2|EP4|EP2xDP2)' --output-on-failure" ;;
    dp4|l8b4|l8b4fp8|moe4|dp8|l8b8|l8b8fp8) MT_RUN_TIMEOUT=300 part "$p" 900 bash bench/gpu_dist_bench.sh "$p" ;;
    moe8|big30b) MT_RUN_TIMEOUT=540 part "$p" 600 bash bench/gpu_dist_bench.sh "$p" ;;
    kprof) part kprof 600 bash bench/gpu_kernel_profile.sh decode moe ;;
    gemvchain) part gemvchain 200 bash -c "timeout 150 $B/bin/cuda_ops_bench --only=gemvchain 2>&1 | grep -v '^{'" ;;
    kprofdec) part kprofdec 300 bash -c "bash bench/gpu_kernel_profile.sh decode | tail -32" ;;
    fp8pg) MT_SKIP_LLAMA8=1 MT_RUN_TIMEOUT=200 part fp8pg 400 bash bench/gpu_dist_bench.sh fp8 ;;
    optests) part optests 400 bash -c "cd $B && ctest -L gpu -R 'Fp8|BackendOps|Decode|InferenceGpu|KvCache' --output-on-failure" ;;
    fp8optin) MT_BENCH_ITERS=8 MT_FP8_RECIPES=tensorwise MT_FP8_OPTIN=1 part fp8optin 500 bash bench/gpu_fp8_bench.sh ;;
    fp8tune) part fp8tune 480 bash -c "(cd $B && timeout 150 ctest -L gpu -R 'Fp8|BackendOps|GemmTune' --output-on-failure);
               timeout 60 $B/bin/cuda_ops_bench --only=fp8cast; MT_GEMM_TUNE=verbose timeout 90 $B/bin/cuda_ops_bench --only=fp8gemm;
               MT_BENCH_ITERS=8 MT_FP8_RECIPES=tensorwise MT_FP8_TUNE_AB=1 MT_FP8_OVERLAP_AB=1 \
               MT_FP8_BF16_BREAKDOWN=0 MT_FP8_CAST_AB=${MT_FP8_CAST_AB:-0} bash bench/gpu_fp8_bench.sh" ;;
    genopt) MT_DECODE_GRAPH_STATS=1 MT_GEN_HF=0 MT_GEN_ARGS="--graphs-only 1 --ttft-prompt 0" part genopt 500 bash -c \
              "(cd $B && ctest -L gpu -R 'Decode|Gemv|InferenceGpu|KvCache' --output-on-failure);
               bash bench/gpu_generate_bench.sh && grep -h 'decode graph at' $OUT/generate_bench.err | head -12" ;;
    stack) MT_DECODE_STACK_TIMES=1 part stack 300 bash -c \
              "(cd $B && ctest -L gpu -R 'DecodeStack' --output-on-failure);
               timeout 150 $B/bin/generate_bench --graphs-only 1 --ttft-prompt 0 --batch 1 2>/dev/null |
               grep -E 'decode_stack_phases|decode_batch1' | awk '!seen[\$0]++'" ;;
    *) say "unknown part $p" ;;
  esac
done
tar -czf "$FINAL/logs.tar.gz" -C "$OUT" . 2>/dev/null
