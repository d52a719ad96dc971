#!/usr/bin/env bash
# PP=2 hang diagnosis on 2 GPUs: the tiny model under several NCCL settings, stacks of a hung run.
cd "$(dirname "$0")/.."
M=/tmp/mt_build/bin/megatron
TINY=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256
      --vocab-size 1000 --micro-batch-size 2 --global-batch-size 8 --train-iters 3 --normalization RMSNorm --swiglu
      --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --seed 3
      --mock-data --bf16 --device cuda --log-interval 1 --eval-iters 0 --no-progress-bar --lr 1e-4
      --data-cache-path /tmp/mt_cache --pipeline-model-parallel-size 2)
try() {  # try NAME ENV...
  local name=$1; shift
  env "$@" NCCL_DEBUG=WARN timeout 25 "$M" launch --nproc-per-node 2 -- pretrain "${TINY[@]}" >"$OUT/diag_$name.txt" 2>&1 &
  local lp=$!
  sleep 18
  if kill -0 $lp 2>/dev/null; then
    echo "[$name] HUNG after 18 s"
    for p in $(pgrep -f "megatron pretrain"); do
      echo "--- pid $p"
      if command -v gdb >/dev/null; then gdb -p $p -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E "^#|^Thread" | grep -vE "libc.so|pthread_cond|futex|poll \(" | head -40
      elif command -v eu-stack >/dev/null; then eu-stack -p $p 2>/dev/null | head -60
      else for t in /proc/$p/task/*; do echo "$t $(cat $t/wchan)"; done; fi
    done
  fi
  wait $lp; echo "[$name] rc $? | $(grep -c '^ iteration' "$OUT/diag_$name.txt") iterations"
  grep -iE "error|warn" "$OUT/diag_$name.txt" | head -5
}
try default
try p2p_off NCCL_P2P_DISABLE=1
try order NCCL_LAUNCH_ORDER_IMPLICIT=1
