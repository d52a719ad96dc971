#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer over the sources they exercise (tests/fuzz/CMakeLists.txt; into
# build-fuzz/), then runs each target for
# a bounded time from its seed corpus. Any crash, sanitizer report, leak, escaped exception or
# allocation over the malloc limit fails the run; the input that did it lands in
# build-fuzz/artifacts/.
#   scripts/fuzz.sh                 every target, 20 s each
#   scripts/fuzz.sh idx 120         one target (fuzz_idx), 120 s
# Needs clang and libclang-rt (scripts/install_deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
# clang and its libFuzzer/sanitizer runtimes (Debian: clang, libclang-rt-14-dev), only for this script.
if ! command -v clang++ >/dev/null 2>&1 || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "[fuzz] apt-get install clang libclang-rt-dev"
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
fi
WHICH=${1:-all}
SECONDS_EACH=${2:-${MT_FUZZ_SECONDS:-20}}
BUILD_DIR=${MT_FUZZ_BUILD_DIR:-build-fuzz}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
FLAGS="$SAN -fsanitize=fuzzer-no-link -g -O1"
LAUNCHER=""
if command -v ccache >/dev/null 2>&1; then LAUNCHER="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"; fi
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMT_CUDA=OFF -DMT_BUILD_TESTS=OFF -DMT_FUZZ=ON -DMT_WERROR=OFF $LAUNCHER \
  "-DCMAKE_C_FLAGS=$FLAGS" "-DCMAKE_CXX_FLAGS=$FLAGS" \
  "-DCMAKE_EXE_LINKER_FLAGS=$SAN" >/dev/null

targets=()
for src in tests/fuzz/fuzz_*.cpp; do
  name=$(basename "$src" .cpp)
  if [ "$WHICH" = all ] || [ "$WHICH" = "${name#fuzz_}" ] || [ "$WHICH" = "$name" ]; then targets+=("$name"); fi
done
if ((${#targets[@]} == 0)); then echo "fuzz.sh: no target matches '$WHICH' (tests/fuzz/fuzz_*.cpp)" >&2; exit 2; fi
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$BUILD_DIR/artifacts"
# One target per core at a time: each libFuzzer run is single-threaded, so on CI's 2 cores two
# run side by side (the whole stage takes half the time for the same seconds per target).
JOBS=${MT_FUZZ_JOBS:-$(nproc)}
run_target() {  # run_target NAME: its seeds copied in, its log in artifacts/NAME.log
  local t=$1 seeds="tests/fuzz/corpus/${1#fuzz_}" work="$BUILD_DIR/corpus/${1#fuzz_}"
  mkdir -p "$work"
  [ -d "$seeds" ] && cp -n "$seeds"/* "$work"/ 2>/dev/null || true
  # -malloc_limit_mb: a parser that allocates hundreds of MB for a few KB of input is a finding.
  (cd "$BUILD_DIR" && TMPDIR=$(mktemp -d) "./bin/$t" -max_total_time="$SECONDS_EACH" -timeout=10 \
     -rss_limit_mb=2048 -malloc_limit_mb=512 -max_len=65536 -print_final_stats=1 \
     -artifact_prefix="artifacts/$t-" "corpus/${t#fuzz_}" >"artifacts/$t.log" 2>&1)
}
for t in "${targets[@]}"; do
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
  echo "[fuzz] $t for ${SECONDS_EACH}s (seeds: $(ls "tests/fuzz/corpus/${t#fuzz_}" 2>/dev/null | wc -l))"
  rm -f "$BUILD_DIR/artifacts/$t.rc"
  (if run_target "$t"; then echo 0; else echo 1; fi >"$BUILD_DIR/artifacts/$t.rc") &
done
wait
failed=()
for t in "${targets[@]}"; do
  if [ "$(cat "$BUILD_DIR/artifacts/$t.rc" 2>/dev/null)" != 0 ]; then
    echo "[fuzz] $t FAILED:"; tail -60 "$BUILD_DIR/artifacts/$t.log"; failed+=("$t")
  else
    grep -E '^stat::number_of_executed_units|^#[0-9]+ *DONE' "$BUILD_DIR/artifacts/$t.log" | tail -2 | sed "s/^/[fuzz] $t: /" || true
  fi
done
if ((${#failed[@]})); then echo "[fuzz] findings in: ${failed[*]}"; exit 1; fi
echo "[fuzz] ${#targets[@]} targets, no findings"
