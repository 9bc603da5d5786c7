#!/usr/bin/env bash
# One-shot GPU check for a session that has the device machine (H200), see
# perf/gpu/README.md. Unpacks the carried .debs/, configures and builds the GPU
# decoder and its tests, runs the bit-exactness tests (every level, dtype, geometry),
# then the throughput benchmark (mistral-7b-sized chunk) and the pinned vs pageable
# H2D bandwidth, and prints a short table last. Everything within ~8 minutes.
#
#   perf/gpu/run.sh            # env: BENCH_TOKENS (1536), JOBS (nproc), BUILD_DIR (build-gpu)
#
# Exit codes: 0 all good, 1 build or test failure, 2 no usable GPU (after building).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
OUTDIR=${OUT:-$BUILD/out}
JOBS=${JOBS:-$(nproc)}
TOKENS=${BENCH_TOKENS:-1536}
START=$(date +%s)
mkdir -p "$OUTDIR"
say() { echo "[run.sh +$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( 470 - ($(date +%s) - START) )); }   # seconds left of the ~8 minute budget

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | sed 's/^/[gpu] /' || say "nvidia-smi not found"

# 1. Dependencies from the carried .deb files (none needed where they are installed).
if compgen -G "$ROOT/.debs/*.deb" >/dev/null; then
  DEBROOT=/tmp/debroot
  rm -rf "$DEBROOT" && mkdir -p "$DEBROOT"
  for f in "$ROOT"/.debs/*.deb; do dpkg -x "$f" "$DEBROOT" || { say "dpkg -x $f failed"; exit 1; }; done
  LIBDIR=$DEBROOT/usr/lib/x86_64-linux-gnu
  export PATH=$DEBROOT/usr/bin:$PATH
  export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$LIBDIR/pkgconfig:$DEBROOT/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$DEBROOT   # .pc files say prefix=/usr
  command -v pkg-config >/dev/null || ln -sf "$DEBROOT/usr/bin/pkgconf" "$DEBROOT/usr/bin/pkg-config"
  DEPS=(-DCMAKE_PREFIX_PATH="$DEBROOT/usr" -DOPENSSL_ROOT_DIR="$DEBROOT/usr"
        -DCMAKE_LIBRARY_PATH="$LIBDIR" -DCMAKE_INCLUDE_PATH="$DEBROOT/usr/include")
  say "unpacked $(ls "$ROOT"/.debs/*.deb | wc -l) .deb files into $DEBROOT"
else
  DEPS=()
  say "no .debs/ folder: using the system's packages"
fi

# 2. Configure and build what the GPU check needs.
say "configure"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSTREAM_WITH_CUDA=ON \
  -DKVSTREAM_WITH_UCX=OFF -DKVSTREAM_WITH_LIBFABRIC=OFF -DKVSTREAM_WITH_URING=OFF \
  -DKVSTREAM_BUILD_EXAMPLES=OFF -DKVSTREAM_BUILD_PERF=OFF -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-80;90}" \
  "${DEPS[@]}" >"$OUTDIR/configure.log" 2>&1 || { tail -40 "$OUTDIR/configure.log"; say "configure FAILED"; exit 1; }
say "build (-j$JOBS)"
ninja -C "$BUILD" -j"$JOBS" test_gpu_decoder >"$OUTDIR/build.log" 2>&1 \
  || { grep -E "error|Error" -A3 "$OUTDIR/build.log" | head -60; tail -20 "$OUTDIR/build.log"; say "build FAILED"; exit 1; }
TEST=$BUILD/bin/test_gpu_decoder

# 3. Is there a GPU at all? (The test's own clear-error check says why not.)
"$TEST" --gtest_filter='GpuDecoder.WithoutAGpuCreateIsAClearError' >"$OUTDIR/probe.log" 2>&1
if ! grep -q "a GPU is present" "$OUTDIR/probe.log"; then
  grep -iE "no usable GPU|unavailable|unsupported" "$OUTDIR/probe.log" | head -3
  say "NO USABLE GPU: built everything, ran nothing on a device (exit 2)"
  exit 2
fi

# 4. Bit-exactness: every comparison must run (no skips) and pass.
say "bit-exactness tests"
timeout $(( $(left) - 240 > 60 ? $(left) - 240 : 60 )) "$TEST" --gtest_filter='-GpuDecoderBench.*' \
  >"$OUTDIR/test.log" 2>&1
TEST_RC=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|Failure|differ" "$OUTDIR/test.log" | head -40
SKIPS=$(grep -c '^\[  SKIPPED \] Geometries' "$OUTDIR/test.log" || true)
[ "$SKIPS" = 0 ] || { say "comparisons were skipped on a GPU machine: $SKIPS"; TEST_RC=1; }

# 5. Throughput.
say "benchmark: $TOKENS tokens of mistral-7b geometry ($(left)s left)"
KVSTREAM_GPU_BENCH=$TOKENS timeout $(( $(left) > 30 ? $(left) : 30 )) "$TEST" \
  --gtest_filter='GpuDecoderBench.*' >"$OUTDIR/bench.log" 2>&1
BENCH_RC=$?
grep -E "^BENCH|Failure|FAILED" "$OUTDIR/bench.log"

# 6. The table.
val() { grep -h "^BENCH" "$OUTDIR/bench.log" | tr ' ' '\n' | grep -A1 -x "$1" | tail -1; }
echo
echo "| measure | value |"
echo "| --- | --- |"
echo "| GPU | $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) |"
echo "| bit-exact tests | $([ $TEST_RC = 0 ] && echo pass || echo FAIL) |"
echo "| chunk | $(val tokens) tokens, level $(val level), $(val chunk_bytes) B coded, $(val out_bytes_f16) B fp16 |"
echo "| GPU decode, wall (host parse + H2D + kernels + sync) | $(val gpu_decode_wall_ms) ms = $(val gpu_decode_GBps) GB/s fp16 |"
echo "| GPU kernels only (rANS + reconstruct) | $(val gpu_rans_ms) + $(val gpu_reconstruct_ms) ms = $(val gpu_kernels_GBps) GB/s |"
echo "| chunk upload (pinned) | $(val gpu_upload_ms) ms |"
echo "| CPU decode, $(val cpu_threads) threads | $(val cpu_decode_ms) ms = $(val cpu_decode_GBps) GB/s |"
echo "| H2D pinned / pageable ($(val copy_bytes) B) | $(val h2d_pinned_GBps) / $(val h2d_pageable_GBps) GB/s |"
say "done"
[ $TEST_RC = 0 ] && [ $BENCH_RC = 0 ] || exit 1
exit 0
