#!/usr/bin/env bash
# `megatron launch`: counts bounded by what the machine can run, parsed without narrowing, and
# multi-node stores that could not work (or would be open) refused before anything starts.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
JOB=(-- pretrain --mock-data --vocab-size 60 --num-layers 1 --hidden-size 16 --num-attention-heads 2
     --seq-length 8 --micro-batch-size 1 --train-iters 1 --lr 1e-3 --eval-iters 0)

expect_error "--nproc-per-node 100000 is more than this machine runs usefully" launch --nproc-per-node 100000 "${JOB[@]}"
expect_error "--nproc-per-node must be at least 1 (got 0)" launch --nproc-per-node 0 "${JOB[@]}"
expect_error "--nproc-per-node: value out of range (got 99999999999999999999" launch --nproc-per-node 99999999999999999999 "${JOB[@]}"
expect_error "--nproc-per-node expects an integer, got '2.5'" launch --nproc-per-node 2.5 "${JOB[@]}"
expect_error "--nnodes x --nproc-per-node: size 9223372036854775807 x 2 is too large" launch --nnodes 9223372036854775807 --nproc-per-node 2 "${JOB[@]}"
expect_error "--nnodes 4294967296 x --nproc-per-node 1 = 4294967296 ranks, more than a job can have" launch --nnodes 4294967296 --nproc-per-node 1 "${JOB[@]}"
expect_error "--node-rank 2 is outside 0 .. 1 (--nnodes 2)" launch --nnodes 2 --node-rank 2 "${JOB[@]}"
expect_error "--master-port 70000 is not a TCP port" launch --master-port 70000 "${JOB[@]}"
expect_error "--grace-seconds must be a finite number, got 'nan'" launch --grace-seconds nan "${JOB[@]}"
expect_error "--grace-seconds -1 is not between 0 and 3600" launch --grace-seconds -1 "${JOB[@]}"
# Several nodes: the store must be reachable by them and need a secret they all know.
expect_error "--master-addr '127.0.0.1' cannot be reached from the other nodes (--nnodes 2)" launch --nnodes 2 "${JOB[@]}"
expect_error "--master-addr '0.0.0.0' cannot be reached" launch --nnodes 2 --master-addr 0.0.0.0 "${JOB[@]}"
expect_error "--nnodes 2: set MT_STORE_SECRET to the same random value on every node" \
  launch --nnodes 2 --node-rank 1 --master-addr 192.0.2.1 "${JOB[@]}"
MT_STORE_SECRET=short expect_error "MT_STORE_SECRET is 5 characters long; use 16 to 256 random ones" \
  launch --nproc-per-node 1 "${JOB[@]}"
finish
