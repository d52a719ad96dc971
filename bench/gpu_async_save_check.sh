set -uo pipefail
export LD_LIBRARY_PATH=$PWD/third_party_carry/gloo/lib; B=/tmp/mt_build
(cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF > $OUT/cfg.txt 2>&1 && cmake --build $B -j16 --target megatron > $OUT/build.txt 2>&1) || { grep error $OUT/build.txt | head; exit 1; }
$B/bin/megatron pretrain --num-layers 16 --hidden-size 2048 --num-attention-heads 32 --group-query-attention --num-query-groups 8 \
  --ffn-hidden-size 8192 --seq-length 2048 --max-position-embeddings 2048 --normalization RMSNorm --swiglu \
  --position-embedding-type rope --rotary-base 500000 --disable-bias-linear --untie-embeddings-and-output-weights \
  --vocab-size 128255 --micro-batch-size 4 --global-batch-size 4 --mock-data --bf16 --device cuda --attention-dropout 0 --hidden-dropout 0 \
  --log-interval 1 --eval-iters 0 --no-progress-bar --lr 1e-4 --data-cache-path /tmp/mt_cache --train-iters 8 \
  --save /tmp/ck --save-interval 4 --async-save --save-retain-interval 100 2>&1 | grep -E "iteration|save" | sed -E 's/\| throughput.*//'
