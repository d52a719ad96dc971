#!/usr/bin/env bash
# Multi-GPU checks and benchmarks on a 2-GPU machine, from the repository root:
#   scripts/device_prep.sh (here), then on the device: bash bench/gpu_dist_bench.sh [parts]
# parts (default all but ops, quickstart, attn, notune, cands, ep, cp, fp8): build, tests, ops, quickstart, smoke,
# single, attn, notune, cands, breakdown, dp, pp, tp, pp8b, and issue #23's ep (moe-2b EP=2 against EP=1 x DP=2
# and one GPU), epov (moe-2b with a shared expert at EP=2: the all-to-all's share with and without
# --moe-shared-expert-overlap), issue #24's dp4 (llama-1.5b weak scaling DP = 1, 2, 4), l8b4 / l8b4fp8
# (llama-8b TP=4+SP, TP=2+SP x DP=2, TP=2 x PP=2, CP=2 x TP=2 at 32k on 4 GPUs) and moe4 (EP=4, EP=2 x DP=2),
# each with megatron estimate's predicted peak beside the measured one; issue #25's dp8, l8b8 / l8b8fp8
# (TP=8+SP, TP=4+SP x DP=2, TP=2 x PP=2 x DP=2 1F1B and interleaved), moe8 (a 12.7B MoE at EP=8 and
# EP=4 x TP=2, 50 steps) and big30b (a 28.6B Llama at TP=4 x PP=2, 50 steps); cp (llama-1.5b CP=2 at seq
# 32k and 64k, p2p and a2a, against CP=1 at the longest that fits one GPU) and fp8 (llama-1.5b DP=2 dist-opt and
# llama-8b TP=2+SP, bf16 against FP8 in one call). Prints one JSON line per
# benchmark (DESIGN.md) plus the derived figures: DP scaling against twice the one-GPU rate,
# pipeline bubble against (PP-1)/(M+PP-1), 1F1B against interleaved. Logs go to $OUT.
# Knobs: MT_COMMIT, MT_BENCH_ITERS, MT_ONE_GPU_TOKS (a one-GPU rate to reuse), MT_RUN_TIMEOUT,
# MT_CTEST_TIMEOUT/MT_CTEST_ARGS, MT_PP_M (micro-batch counts), MT_PP_SPLITS (even balanced),
# MT_PP_EXTRA (flags added to the PP runs, e.g. --log-op-breakdown for per-stage times),
# MT_CP_SEQS / MT_CP_COMMS / MT_CP_ONE_GPU=0 (the cp part's sequences, comm types, and whether to
# rerun the one-GPU reference), MT_SKIP_LLAMA8=1 (the fp8 part without llama-8b),
# MT_LLAMA8_ITERS, MT_TP_TIMED=1 (adds a timed TP run), MT_RUN_EXTRA (flags added to every training run, e.g. --attention-backend flash).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/llama_1_5b.sh
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
PARTS=${1:-build,tests,smoke,single,breakdown,dp,pp,tp,pp8b}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
ITERS=${MT_BENCH_ITERS:-12}
COMMIT=${MT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
NGPU=$(nvidia-smi -L | grep -c '^GPU')
echo "device: ${NGPU}x $GPU, commit $COMMIT"
if has build; then
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF \
    >"$OUT/configure.txt" 2>&1 || { echo "configure failed"; grep -A8 "CMake Error" "$OUT/configure.txt" | head -40; exit 1; }
  cmake --build "$B" -j"$(nproc)" >"$OUT/build.txt" 2>&1 ||
    { echo "build failed"; grep -E "error|FAILED" "$OUT/build.txt" | head -30; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
M="$B/bin/megatron"

if has tests; then
  t0=$(date +%s)
  (cd "$B" && timeout ${MT_CTEST_TIMEOUT:-420} ctest -L gpu ${MT_CTEST_ARGS:-} --output-on-failure >"$OUT/ctest.txt" 2>&1)
  echo "ctest -L gpu ($(( $(date +%s) - t0 )) s): $(grep -E 'tests passed|tests failed' "$OUT/ctest.txt")"
  grep -E "^\s*[0-9]+/[0-9]+ Test.*(Failed|Timeout|Exception)" "$OUT/ctest.txt" | head -20
  grep -E "\[ gpu layout \]" "$OUT/ctest.txt"
fi

if has ops; then  # kernel micro-benchmarks: GEMM shapes, attention (each backend), memory-bound ops
  "$B/bin/cuda_ops_bench" ${MT_OPS_ARGS:-} >"$OUT/ops.txt" 2>&1 || { echo "cuda_ops_bench failed"; tail -5 "$OUT/ops.txt"; }
  grep -E "^attn" "$OUT/ops.txt"
fi
if has quickstart; then  # README command 1's training on the GPU (data/brown and the GPT-2 files carried)
  t0=$(date +%s)
  MT_QUICKSTART_BIN="$M" MT_QUICKSTART_RUN=/tmp/mt_quickstart ./scripts/quickstart.sh >"$OUT/quickstart.txt" 2>&1
  echo "quickstart rc $? ($(( $(date +%s) - t0 )) s): $(grep -E 'held-out loss' "$OUT/quickstart.txt")"
  grep -m1 -E "^ iteration" "$OUT/quickstart.txt"; grep -m1 -iE "device|GPU" "$OUT/quickstart.txt"; tail -2 "$OUT/quickstart.txt"
fi

# shellcheck disable=SC2206
COMMON=(--mock-data --bf16 --device cuda --log-interval 1 --eval-iters 0 --no-progress-bar --lr 1e-4 --clip-grad 1.0
        --attention-dropout 0 --hidden-dropout 0 --data-cache-path /tmp/mt_cache ${MT_RUN_EXTRA:-})
# run NAME NPROC ARGS...: trains, prints the JSON line, leaves "median tokens/s" in $TOK.
run() {
  local name=$1 n=$2; shift 2
  local t0; t0=$(date +%s)
  if [ "$n" = 1 ]; then "$M" pretrain "$@" "${COMMON[@]}" >"$OUT/$name.txt" 2>&1
  else timeout ${MT_RUN_TIMEOUT:-400} "$M" launch --nproc-per-node "$n" -- pretrain "$@" "${COMMON[@]}" >"$OUT/$name.txt" 2>&1; fi
  local rc=$?
  TOK=0; MS=0
  [ $rc -ne 0 ] && { echo "$name failed (rc $rc)"; grep -iE "error|fail" "$OUT/$name.txt" | head -5; tail -3 "$OUT/$name.txt"; return; }
  grep '^ iteration' "$OUT/$name.txt" | tail -n +4 |
    sed -E 's/.*iteration \(ms\): ([0-9.]+).*TFLOP\/s\/GPU\): ([0-9.]+).*tokens per second: ([0-9]+).*/\1 \2 \3/' |
    sort -n >"$OUT/$name.ms"
  local k; k=$(wc -l <"$OUT/$name.ms")
  read -r ms tf tok < <(sed -n "$(( (k + 1) / 2 ))p" "$OUT/$name.ms")
  TOK=$tok; MS=$ms
  local mem; mem=$(grep -oE 'peak GPU memory: [0-9.]+' "$OUT/$name.txt" | awk '{print $4}' | sort -n | tail -1)
  printf '{"bench":"%s","device":"%sx %s","gpus":%s,"tokens_per_s":%s,"model_tflops_per_gpu":%s,"mfu_pct":%.1f,"peak_mem_gib":%s,"step_time_median_ms":%s,"iters":%s,"wall_s":%s,"commit":"%s"}\n' \
    "$name" "$n" "$GPU" "$n" "$tok" "$tf" "$(echo "$tf" | awk '{print 100 * $1 / 989}')" "${mem:-null}" "$ms" \
    "$(grep -c '^ iteration' "$OUT/$name.txt")" \
    "$(( $(date +%s) - t0 ))" "$COMMIT"
  grep -E "time breakdown" "$OUT/$name.txt" | head -2
}

if has smoke; then  # the CLI path through megatron launch: DP=2, TP=2, PP=2 on a tiny model
  TINY=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256
        --vocab-size 1000 --micro-batch-size 2 --global-batch-size 16 --train-iters 30 --normalization RMSNorm --swiglu
        --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --seed 3)
  for lay in "" "--tensor-model-parallel-size 2 --sequence-parallel" "--pipeline-model-parallel-size 2" \
             "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"; do
    # shellcheck disable=SC2086
    timeout 120 "$M" launch --nproc-per-node 2 -- pretrain "${TINY[@]}" "${COMMON[@]}" $lay >"$OUT/smoke.txt" 2>&1
    echo "smoke [${lay:-dp2}] rc $? | $(grep '^ iteration' "$OUT/smoke.txt" | sed -n '1p;$p' | grep -oE 'lm loss: [0-9.E+-]+' | tr '\n' ' ')"
    grep -iE "error" "$OUT/smoke.txt" | head -3
  done
fi

LLAMA=("${LLAMA_1_5B[@]}" --train-iters "$ITERS")
ONE=${MT_ONE_GPU_TOKS:-0}  # a one-GPU rate measured earlier, to skip re-measuring it
if has single || { [ "$ONE" = 0 ] && { has dp || has pp; }; }; then
  run llama-1.5b-1gpu 1 "${LLAMA[@]}" --global-batch-size 32; ONE=$TOK
fi
if has attn; then  # the same run with our flash kernels instead of the automatic choice (cuDNN where it serves)
  run llama-1.5b-1gpu-flash 1 "${LLAMA[@]}" --global-batch-size 32 --attention-backend flash
  run llama-1.5b-1gpu-nondet 1 "${LLAMA[@]}" --global-batch-size 32 --nondeterministic-attention
fi
if has notune; then  # the same run with the heuristic's GEMM choice only (no per-shape autotuning)
  MT_GEMM_TUNE=0 run llama-1.5b-1gpu-notune 1 "${LLAMA[@]}" --global-batch-size 32
fi
if has cands; then  # more of cuBLASLt's candidates per GEMM shape for the autotuner (MT_GEMM_TUNE_CANDIDATES)
  for c in 16 32; do MT_GEMM_TUNE_CANDIDATES=$c run llama-1.5b-1gpu-cands$c 1 "${LLAMA[@]}" --global-batch-size 32; done
fi
if has breakdown; then  # per-op GPU time (CUDA events cost a little, so a run of its own)
  run llama-1.5b-1gpu-timed 1 "${LLAMA[@]}" --global-batch-size 32 --log-op-breakdown
fi
if has dp; then
  run llama-1.5b-dp2-overlap 2 "${LLAMA[@]}" --global-batch-size 64 --overlap-grad-reduce
  echo "DP=2 scaling with --overlap-grad-reduce: $(awk -v a="$TOK" -v b="$ONE" 'BEGIN{printf "%.1f%%", (b > 0 ? 100*a/(2*b) : 0)}') of 2x one GPU"
  run llama-1.5b-dp2-distopt 2 "${LLAMA[@]}" --global-batch-size 64 --overlap-grad-reduce --use-distributed-optimizer \
    --overlap-param-gather
  echo "DP=2 scaling with the distributed optimizer: $(awk -v a="$TOK" -v b="$ONE" 'BEGIN{printf "%.1f%%", (b > 0 ? 100*a/(2*b) : 0)}') of 2x one GPU"
fi
if has pp; then
  # Bubble: the measured rate against two GPUs' worth of the one-GPU rate (the same
  # micro-batches, so everything missing is pipeline bubble, stage imbalance and transfer cost).
  # Splits (MT_PP_SPLITS): even = 8+8 layers, so the last stage also carries the 128k-vocab
  # output layer and loss (about 2.3 layers' worth); balanced = --decoder-last-pipeline-num-layers 6.
  bubble() { awk -v a="$TOK" -v b="$ONE" 'BEGIN{printf "%.1f%%", (b > 0 ? 100*(1-a/(2*b)) : 0)}'; }
  for mb in ${MT_PP_M:-4 8 16}; do
    for split in ${MT_PP_SPLITS:-even balanced}; do
      SPLIT=(); [ "$split" = balanced ] && SPLIT=(--decoder-last-pipeline-num-layers 6)
      run "llama-1.5b-pp2-$split-m$mb" 2 "${LLAMA[@]}" --pipeline-model-parallel-size 2 "${SPLIT[@]}" \
        --global-batch-size $((4 * mb)) ${MT_PP_EXTRA:-}
      echo "PP=2 M=$mb 1F1B $split: measured bubble $(bubble), theory (PP-1)/(M+PP-1) = $(awk -v m=$mb 'BEGIN{printf "%.1f%%", 100/(m+1)}')"
      run "llama-1.5b-pp2-vpp2-$split-m$mb" 2 "${LLAMA[@]}" --pipeline-model-parallel-size 2 "${SPLIT[@]}" \
        --num-virtual-stages-per-pipeline-rank 2 --global-batch-size $((4 * mb)) ${MT_PP_EXTRA:-}
      echo "PP=2 VPP=2 M=$mb interleaved $split: measured bubble $(bubble), theory (PP-1)/(V*M+PP-1) = $(awk -v m=$mb 'BEGIN{printf "%.1f%%", 100/(2*m+1)}')"
    done
  done
fi
LLAMA8=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8
        --ffn-hidden-size 14336 --seq-length 4096 --max-position-embeddings 4096 --normalization RMSNorm --swiglu
        --position-embedding-type rope --rotary-base 500000 --disable-bias-linear --untie-embeddings-and-output-weights
        --vocab-size 128255 --micro-batch-size 1 --train-iters "${MT_LLAMA8_ITERS:-8}")
if has tp; then
  run llama-8b-tp2-sp 2 "${LLAMA8[@]}" --global-batch-size 8 --tensor-model-parallel-size 2 --sequence-parallel
  run llama-8b-tp2-sp-overlap 2 "${LLAMA8[@]}" --global-batch-size 8 --tensor-model-parallel-size 2 --sequence-parallel \
    --tp-comm-overlap
  if [ -n "${MT_TP_TIMED:-}" ]; then  # per-op breakdown of the overlapped run (CUDA events cost a little)
    run llama-8b-tp2-sp-overlap-timed 2 "${LLAMA8[@]}" --global-batch-size 8 --tensor-model-parallel-size 2 \
      --sequence-parallel --tp-comm-overlap --log-op-breakdown
  fi
fi
if has ep; then  # #23 item 1: expert parallelism over NCCL (moe-2b, 8 experts, top-2, aux loss)
  source bench/moe_2b.sh
  MOE=("${MOE_2B[@]}" --train-iters "$ITERS")
  run moe-2b-1gpu 1 "${MOE[@]}" --global-batch-size 32; MOE1=$TOK
  run moe-2b-ep1-dp2 2 "${MOE[@]}" --global-batch-size 64
  echo "moe-2b EP=1 x DP=2: $(awk -v a="$TOK" -v b="$MOE1" 'BEGIN{printf "%.1f%%", (b > 0 ? 100*a/(2*b) : 0)}') of 2x one GPU"
  run moe-2b-ep2 2 "${MOE[@]}" --global-batch-size 64 --expert-model-parallel-size 2
  echo "moe-2b EP=2: $(awk -v a="$TOK" -v b="$MOE1" 'BEGIN{printf "%.1f%%", (b > 0 ? 100*a/(2*b) : 0)}') of 2x one GPU"
  run moe-2b-ep2-timed 2 "${MOE[@]}" --global-batch-size 64 --expert-model-parallel-size 2 --log-op-breakdown
  # The loss trajectories side by side (same data order: EP=2's DP=2 for the dense part).
  for n in moe-2b-1gpu moe-2b-ep1-dp2 moe-2b-ep2; do
    echo "$n losses: $(grep -oE 'lm loss: [0-9.E+-]+' "$OUT/$n.txt" | awk '{printf "%.4f ", $3}')"
  done
fi
if has epov; then  # #23 item 1, overlapped: moe-2b with a shared expert, its compute under the all-to-all or not
  source bench/moe_2b.sh
  SH=("${MOE_2B[@]}" --train-iters "$ITERS" --global-batch-size 64 --expert-model-parallel-size 2
      --moe-shared-expert-intermediate-size 2048)
  run moe-2b-shared-ep2 2 "${SH[@]}"; NOOV=$TOK
  run moe-2b-shared-ep2-overlap 2 "${SH[@]}" --moe-shared-expert-overlap
  echo "shared-expert overlap: $(awk -v a="$TOK" -v b="$NOOV" 'BEGIN{printf "%.3f", (b > 0 ? a/b : 0)}')x the tokens/s without"
  run moe-2b-shared-ep2-timed 2 "${SH[@]}" --log-op-breakdown
  run moe-2b-shared-ep2-overlap-timed 2 "${SH[@]}" --moe-shared-expert-overlap --log-op-breakdown
fi
if has cp; then  # #23 item 2: context parallelism over NCCL at long sequences (mbs 1, full recompute)
  LONG=("${LLAMA_1_5B[@]}" --micro-batch-size 1 --global-batch-size 2 --train-iters "${MT_CP_ITERS:-6}"
        --recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
  for seq in ${MT_CP_SEQS:-32768 65536}; do
    SEQ=(--seq-length "$seq" --max-position-embeddings "$seq")
    # The one-GPU reference takes the same global batch (2 micro-batches accumulated) so that
    # its loss trajectory is the one CP=2 must reproduce.
    [ "${MT_CP_ONE_GPU:-1}" = 1 ] && run "llama-1.5b-seq$seq-1gpu" 1 "${LONG[@]}" "${SEQ[@]}"
    for comm in ${MT_CP_COMMS:-p2p a2a}; do
      run "llama-1.5b-seq$seq-cp2-$comm" 2 "${LONG[@]}" "${SEQ[@]}" --context-parallel-size 2 --cp-comm-type "$comm"
    done
    for f in "$OUT"/llama-1.5b-seq"$seq"-*.txt; do
      echo "$(basename "$f" .txt) losses: $(grep -oE 'lm loss: [0-9.E+-]+' "$f" | awk '{printf "%.4f ", $3}')"
    done
  done
fi
if has fp8; then  # #23 item 3: FP8 with data and tensor parallelism, bf16 in the same call
  FP8=(--fp8-format hybrid --fp8-recipe tensorwise)
  run llama-1.5b-dp2-distopt-bf16 2 "${LLAMA[@]}" --global-batch-size 64 --use-distributed-optimizer --overlap-grad-reduce
  run llama-1.5b-dp2-distopt-fp8 2 "${LLAMA[@]}" --global-batch-size 64 --use-distributed-optimizer --overlap-grad-reduce \
    "${FP8[@]}"
  run llama-1.5b-dp2-distopt-fp8-param-gather 2 "${LLAMA[@]}" --global-batch-size 64 --use-distributed-optimizer \
    --overlap-grad-reduce "${FP8[@]}" --fp8-param-gather
  if [ "${MT_SKIP_LLAMA8:-0}" != 1 ]; then
    run llama-8b-tp2-sp-bf16 2 "${LLAMA8[@]}" --global-batch-size 8 --tensor-model-parallel-size 2 --sequence-parallel
    run llama-8b-tp2-sp-fp8 2 "${LLAMA8[@]}" --global-batch-size 8 --tensor-model-parallel-size 2 --sequence-parallel \
      "${FP8[@]}"
  fi
fi
# Issue #24: four GPUs. Each run's predicted peak (megatron estimate, the same flags) beside the
# measured one: est NAME NPROC ARGS... prints the estimate's "tensor pool peak" (what the peak line
# reports; the busiest stage's where there are several).
est() {
  local name=$1 n=$2; shift 2
  local p; p=$("$M" estimate "$@" --bf16 --world-size "$n" 2>&1 | awk '/= tensor pool peak/ {m = 0; for (i = 1; i <= NF; i++) if ($i + 0 > m) m = $i + 0; print m}')
  echo "$name: estimated peak ${p:-?} GiB, measured $(grep -oE 'peak GPU memory: [0-9.]+' "$OUT/$name.txt" 2>/dev/null |
    awk '{print $4}' | sort -n | tail -1) GiB"
}
DISTOPT=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
# Weak scaling of llama-1.5b (#24 item 1: DP = 1, 2, 4; #25 item 1: DP = 1, 2, 4, 8), 32 samples
# per GPU per step.
dp_scale() {
  local n
  for n in "$@"; do
    run "llama-1.5b-dp$n-distopt" "$n" "${LLAMA[@]}" --global-batch-size $((32 * n)) "${DISTOPT[@]}"
    [ "$n" = 1 ] && DP1=$TOK
    echo "DP=$n weak scaling: $(awk -v a="$TOK" -v b="${DP1:-0}" -v n="$n" 'BEGIN{printf "%.1f%%", (b > 0 ? 100*a/(n*b) : 0)}') of ${n}x DP=1"
    est "llama-1.5b-dp$n-distopt" "$n" "${LLAMA[@]}" --global-batch-size $((32 * n)) "${DISTOPT[@]}"
  done
}
has dp4 && dp_scale 1 2 4
has dp8 && dp_scale 1 2 4 8
# llama-8b layouts, each in bf16 and FP8 (tensorwise): #24 item 2 on four GPUs (parts l8b4, l8b4fp8),
# #25 item 2 on eight (l8b8, l8b8fp8). NAME|FLAGS[|GLOBAL BATCH] entries (default batch: 2 per GPU),
# all with the distributed optimizer and both overlaps (as a Megatron user would run them).
L8B_LAYOUTS4=("tp4-sp|--tensor-model-parallel-size 4 --sequence-parallel"
              "tp2-sp-dp2|--tensor-model-parallel-size 2 --sequence-parallel"
              "tp2-pp2|--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2"
              "cp2-tp2-seq32k|--context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel --seq-length 32768 --max-position-embeddings 32768 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1|2")
L8B_LAYOUTS8=("tp8-sp|--tensor-model-parallel-size 8 --sequence-parallel"
              "tp4-sp-dp2|--tensor-model-parallel-size 4 --sequence-parallel"
              "tp2-pp2-dp2|--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2"
              "tp2-pp2-dp2-vpp2|--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2")
l8b_layouts() {  # l8b_layouts NGPU PREC LAYOUT...
  local n=$1 prec=$2 entry lname flags gbs; shift 2
  local PREC=(); [ "$prec" = fp8 ] && PREC=(--fp8-format hybrid --fp8-recipe tensorwise)
  for entry in "$@"; do
    IFS='|' read -r lname flags gbs <<<"$entry"
    gbs=${gbs:-$((2 * n))}
    # shellcheck disable=SC2206
    local lay=($flags)
    run "llama-8b-$lname-$prec" "$n" "${LLAMA8[@]}" --global-batch-size "$gbs" "${DISTOPT[@]}" "${lay[@]}" "${PREC[@]}"
    est "llama-8b-$lname-$prec" "$n" "${LLAMA8[@]}" --global-batch-size "$gbs" "${DISTOPT[@]}" "${lay[@]}"
  done
}
has l8b4 && l8b_layouts 4 bf16 "${L8B_LAYOUTS4[@]}"
has l8b4fp8 && l8b_layouts 4 fp8 "${L8B_LAYOUTS4[@]}"
has l8b8 && l8b_layouts 8 bf16 "${L8B_LAYOUTS8[@]}"
has l8b8fp8 && l8b_layouts 8 fp8 "${L8B_LAYOUTS8[@]}"
if has moe4; then  # #24 item 3: moe-2b with EP=4 and EP=2 x DP=2 (dense part DP=4 in both), all-to-all share
  source bench/moe_2b.sh
  M4=("${MOE_2B[@]}" --train-iters "$ITERS" --global-batch-size 128)
  for ep in 4 2; do
    run "moe-2b-ep$ep-4gpu" 4 "${M4[@]}" --expert-model-parallel-size $ep
    run "moe-2b-ep$ep-4gpu-timed" 4 "${M4[@]}" --expert-model-parallel-size $ep --log-op-breakdown
    est "moe-2b-ep$ep-4gpu" 4 "${M4[@]}" --expert-model-parallel-size $ep
  done
fi
if has moe8; then  # #25 item 3: a Mixtral-class MoE that needs 8 GPUs (12.7B parameters, 8 experts of ffn 8192), 50 steps
  MOE12=(--num-layers 24 --hidden-size 2560 --num-attention-heads 20 --group-query-attention --num-query-groups 4
         --ffn-hidden-size 8192 --seq-length 2048 --max-position-embeddings 2048 --normalization RMSNorm --swiglu
         --position-embedding-type rope --rotary-base 500000 --disable-bias-linear --untie-embeddings-and-output-weights
         --vocab-size 128255 --micro-batch-size 2 --global-batch-size 64 --num-experts 8 --moe-ffn-hidden-size 8192
         --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm
         --moe-token-dispatcher-type alltoall --use-distributed-optimizer --train-iters "${MT_BIG_ITERS:-50}")
  for entry in "ep8|--expert-model-parallel-size 8" "ep4-tp2|--expert-model-parallel-size 4 --tensor-model-parallel-size 2 --sequence-parallel"; do
    # shellcheck disable=SC2206
    lay=(${entry#*|})
    run "moe-12b-${entry%%|*}" 8 "${MOE12[@]}" "${lay[@]}" --log-op-breakdown
    echo "moe-12b-${entry%%|*} losses (first, last): $(grep -oE 'lm loss: [0-9.E+-]+' "$OUT/moe-12b-${entry%%|*}.txt" | sed -n '1p;$p' | awk '{printf "%s ", $3}')"
    est "moe-12b-${entry%%|*}" 8 "${MOE12[@]}" "${lay[@]}"
  done
fi
if has big30b; then  # #25 item 4: a 28.6B Llama (274 GiB per GPU at TP=2) at TP=4 x PP=2, 50 steps
  BIG=(--num-layers 48 --hidden-size 7168 --num-attention-heads 56 --group-query-attention --num-query-groups 8
       --ffn-hidden-size 20480 --seq-length 4096 --max-position-embeddings 4096 --normalization RMSNorm --swiglu
       --position-embedding-type rope --rotary-base 500000 --disable-bias-linear --untie-embeddings-and-output-weights
       --vocab-size 128255 --micro-batch-size 1 --global-batch-size 16 --tensor-model-parallel-size 4 --sequence-parallel
       --pipeline-model-parallel-size 2 --use-distributed-optimizer --recompute-granularity full --recompute-method uniform
       --recompute-num-layers 1 --train-iters "${MT_BIG_ITERS:-50}")
  run llama-30b-tp4-pp2 8 "${BIG[@]}"
  echo "llama-30b-tp4-pp2 losses (first, last): $(grep -oE 'lm loss: [0-9.E+-]+' "$OUT/llama-30b-tp4-pp2.txt" | sed -n '1p;$p' | awk '{printf "%s ", $3}')"
  est llama-30b-tp4-pp2 8 "${BIG[@]}"
fi
if has pp8b; then
  # A model that needs the pipeline: llama-8b's bf16 weights, fp32 main params, grads and Adam
  # state are 18 bytes x 8.0B = 144 GB, more than one H200. 18+14 layers (the last stage also
  # has the output layer, ~2.3 layers' worth). No one-GPU reference exists, so the bubble comes
  # from the step times: t(M) = a*M + b over two micro-batch counts, bubble = b / t(M).
  SPLIT8=(--pipeline-model-parallel-size 2 --decoder-last-pipeline-num-layers 14)
  run llama-8b-pp2-m4 2 "${LLAMA8[@]}" "${SPLIT8[@]}" --global-batch-size 4; T4=$MS
  run llama-8b-pp2-m8 2 "${LLAMA8[@]}" "${SPLIT8[@]}" --global-batch-size 8; T8=$MS
  awk -v t4="$T4" -v t8="$T8" 'BEGIN { a = (t8 - t4) / 4; b = t4 - 4 * a; if (a > 0)
    printf "llama-8b PP=2 1F1B: step = %.1f ms x M + %.1f ms; bubble %.1f%% at M=4 (theory 20.0%%), %.1f%% at M=8 (theory 11.1%%)\n",
      a, b, 100 * b / t4, 100 * b / t8 }'
  run llama-8b-pp2-vpp2-m4 2 "${LLAMA8[@]}" "${SPLIT8[@]}" --num-virtual-stages-per-pipeline-rank 2 --global-batch-size 4
  echo "llama-8b PP=2 M=4: interleaved $MS ms against 1F1B $T4 ms per step"
fi
