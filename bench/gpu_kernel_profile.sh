#!/usr/bin/env bash
# Where a GPU workload's time goes, kernel by kernel (Nsight Compute, one cheap metric per kernel):
# the kernels grouped by name with their count, total time and share of the captured time, the
# largest first. For what the op breakdown cannot show: decode's per-token kernels (#22) and the
# kernels inside one MoE training step (#17).
#   bash bench/gpu_kernel_profile.sh decode   generate_bench at batch 1, decode kernels only
#                                             (the prompt's prefill and the graph capture are skipped)
#   bash bench/gpu_kernel_profile.sh moe      moe-2b, one micro-batch per step, iteration 4 only
#                                             (--profile --profile-step-start 3 --profile-step-end 4)
# Expects the build of bench/gpu_issue_checks.sh in $MT_DEVICE_BUILD (/tmp/mt_build). Logs and the
# raw CSV go to $OUT; prints one table and one JSON line per workload.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
COMMIT=${MT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

# summarise NAME CSV: ncu's raw page (a header row, a units row, then a row per kernel) grouped by
# kernel name.
summarise() {
  python3 - "$1" "$2" "$COMMIT" <<'EOF'
import csv, json, sys, collections
name, path, commit = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [r for r in csv.reader(open(path)) if r]
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    print(f"{name}: no kernel rows in {path}"); sys.exit(0)
cols = rows[head]
k, t = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
unit = rows[head + 1][t] if len(rows) > head + 1 else "ns"
scale = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3}.get(unit, 1e-3)
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[head + 2:]:
    try:
        v = float(r[t].replace(",", ""))
    except (ValueError, IndexError):
        continue
    key = r[k].split("(")[0].strip()[:90]
    tot[key] += v * scale
    cnt[key] += 1
total = sum(tot.values())
print(f"{name}: {sum(cnt.values())} kernels, {total / 1e3:.3f} ms of kernel time")
for key, us in tot.most_common(25):
    print(f"  {100 * us / total:5.1f}%  {us / 1e3:9.3f} ms  x{cnt[key]:<6d} {key}")
print(json.dumps({"bench": f"kernel-profile-{name}", "kernels": sum(cnt.values()), "kernel_ms": round(total / 1e3, 3),
                  "top": [[key, round(100 * us / total, 1)] for key, us in tot.most_common(8)], "commit": commit}))
EOF
}

for what in "${@:-decode moe}"; do
  case $what in
    decode)
      GB="$B/generate_bench"; [ -x "$GB" ] || GB="$B/bin/generate_bench"
      # generate_bench's first mode: batch 1, eager (each kernel its own launch), the GEMV linears.
      # Its warm-up (a 128-token prefill and 8 tokens, ~1,800 kernels) and the timed run's prefill
      # are skipped by count, so the window is ~10 decode tokens of the timed run
      # (MT_PROF_SKIP / MT_PROF_COUNT move it).
      # Clocks and caches as in a real run (ncu's defaults lock base clocks and flush the caches
      # before every kernel, which inflated each small decode kernel and every GEMV's L2 prefetch).
      timeout 400 "$NCU" --metrics gpu__time_duration.sum --csv --page raw \
        --clock-control none --cache-control none --launch-skip "${MT_PROF_SKIP:-3000}" --launch-count "${MT_PROF_COUNT:-2000}" \
        "$GB" --prompt 128 --new 64 --batch 1 --ttft-prompt 0 \
        >"$OUT/profile_decode.csv" 2>"$OUT/profile_decode.err"
      echo "decode capture: exit $?"
      summarise decode "$OUT/profile_decode.csv" ;;
    moe)
      source bench/moe_2b.sh
      timeout 500 "$NCU" --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw --launch-count 20000 \
        "$B/bin/megatron" pretrain "${MOE_2B[@]}" --global-batch-size 4 --train-iters 5 --mock-data --bf16 --device cuda \
        --log-interval 1 --eval-iters 0 --no-progress-bar --lr 1e-4 --attention-dropout 0 --hidden-dropout 0 \
        --data-cache-path /tmp/mt_cache --profile --profile-step-start 3 --profile-step-end 4 \
        >"$OUT/profile_moe.csv" 2>"$OUT/profile_moe.err"
      echo "moe capture: exit $?"
      summarise moe "$OUT/profile_moe.csv" ;;
    *) echo "unknown workload $what (decode, moe)" ;;
  esac
done
