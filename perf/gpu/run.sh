#!/usr/bin/env bash
# One-shot GPU check for a session that has the device machine (H200), see
# perf/gpu/README.md. Unpacks the carried .debs/, configures and builds the GPU
# decoder and its tests, runs the bit-exactness tests (every level, dtype, geometry),
# (packed and paged device output, stream-ordered decode with its device verdict, a
# captured graph, every prefix of progressive streams and every refinement), then the throughput benchmark (mistral-7b-sized chunk: synchronous,
# and stream-ordered into paged device KV) and the pinned vs pageable
# H2D bandwidth, then the pipeline's GPU path: its tests (a fetch into device memory
# equals the CPU's fetch bit for bit; the store's refinement of device KV equals the
# CPU decode of the finer level) and the pipelined fetch with GPU decode over
# loopback tcp (kvstream-bench pipeline --decode gpu, needs the tinyllama data), and
# prints a short table last. Everything within ~8 minutes.
#
#   perf/gpu/run.sh    # env: BENCH_TOKENS (1536), PIPE_TOKENS (6144), JOBS (nproc),
#                      #      BUILD_DIR (build-gpu), KVSTREAM_TINYLLAMA (data directory)
#
# Exit codes: 0 all good, 1 build or test failure, 2 no usable GPU (after building).
# The pipeline part is skipped, with a line in the table saying why, when its build
# fails or the tinyllama data is absent; those do not change the exit code.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
# Logs go to $BUILD/logs; where OUT is set (the device machine, which returns at most 8
# files) they also come back as one $OUT/gpu-logs.tgz, written on every exit.
OUTDIR=$BUILD/logs
JOBS=${JOBS:-$(nproc)}
TOKENS=${BENCH_TOKENS:-1536}
PIPE_TOKENS=${PIPE_TOKENS:-6144}
START=$(date +%s)
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
[ -n "${OUT:-}" ] && trap 'tar czf "$OUT/gpu-logs.tgz" -C "$OUTDIR" . 2>/dev/null' EXIT
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

# 2. Configure and build what the GPU check needs. io_uring (tcp backend, liburing
# from .debs), examples (tinyllama) and perf (kvstream-bench) are on for the pipeline
# part; UCX and libfabric stay off.
say "configure"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSTREAM_WITH_CUDA=ON \
  -DKVSTREAM_WITH_UCX=OFF -DKVSTREAM_WITH_LIBFABRIC=OFF -DKVSTREAM_WITH_URING=AUTO -DKVSTREAM_WITH_REDIS=OFF -DKVSTREAM_WITH_ETCD=OFF \
  -DKVSTREAM_BUILD_EXAMPLES=ON -DKVSTREAM_BUILD_PERF=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-80;90}" \
  "${DEPS[@]}" >"$OUTDIR/configure.log" 2>&1 || { tail -40 "$OUTDIR/configure.log"; say "configure FAILED"; exit 1; }
grep -E "kvstream [0-9.]+:" "$OUTDIR/configure.log" | sed 's/^-- /[configure] /'
say "build the decoder tests (-j$JOBS)"
ninja -C "$BUILD" -j"$JOBS" test_gpu_decoder kvstream-gpu-bench >"$OUTDIR/build.log" 2>&1 \
  || { grep -E "error|Error" -A3 "$OUTDIR/build.log" | head -60; tail -20 "$OUTDIR/build.log"; say "build FAILED"; exit 1; }
TEST=$BUILD/bin/test_gpu_decoder
GPU_BENCH=$BUILD/bin/kvstream-gpu-bench
# The pipeline part builds separately: its failure skips only that part.
say "build the pipeline and store tests and kvstream-bench (-j$JOBS)"
PIPE=ok
if ! grep -q "io_uring=ON" "$OUTDIR/configure.log"; then
  PIPE="skipped: no tcp backend (liburing not found; run perf/gpu/fetch-debs.sh)"
elif ! ninja -C "$BUILD" -j"$JOBS" test_pipeline test_store kvstream-bench >"$OUTDIR/build-pipeline.log" 2>&1; then
  grep -E "error" -A3 "$OUTDIR/build-pipeline.log" | head -30
  PIPE="skipped: build FAILED (build-pipeline.log)"
fi
PTEST=$BUILD/bin/test_pipeline
STEST=$BUILD/bin/test_store
BENCH=$BUILD/bin/kvstream-bench
DATA=
for d in "${KVSTREAM_TINYLLAMA:-}" "$ROOT/shared/data/tinyllama" "$ROOT/../shared/data/tinyllama" "$ROOT/.tinyllama"; do
  [ -n "$d" ] && [ -f "$d/stories260K.bin" ] && { DATA=$d; break; }
done
[ "$PIPE" = ok ] && [ -z "$DATA" ] && PIPE_BENCH="skipped: no tinyllama data (carry .tinyllama, see README)" \
  || PIPE_BENCH=$PIPE
[ "$PIPE" != ok ] && say "pipeline part $PIPE"
[ "$PIPE_BENCH" != ok ] && say "pipeline benchmark $PIPE_BENCH"
# JSON number or string of a kvstream-bench --json file.
jv() { grep -o "\"$2\": *[^,}]*" "$1" 2>/dev/null | head -1 | sed 's/^[^:]*: *//; s/"//g'; }
# The pipeline's GPU tests; $1 = gtest filter. Sets PTEST_RC and prints the verdicts.
pipeline_tests() {
  timeout 120 "$PTEST" --gtest_filter="$1" >"$OUTDIR/pipeline-test.log" 2>&1
  PTEST_RC=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|Failure|^decode=gpu|^GPUDirect|Skipped" -A1 "$OUTDIR/pipeline-test.log" \
    | grep -v "^--" | head -20
}
# The store's refinement of device KV (its GPU case, or without a GPU its clear error).
# Sets STEST_RC; a skip of the GPU case on a GPU machine is a failure.
store_tests() {
  timeout 120 "$STEST" --gtest_filter='StoreTest.*DeviceKv*' >"$OUTDIR/store-test.log" 2>&1
  STEST_RC=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|Failure" -A1 "$OUTDIR/store-test.log" | grep -v "^--" | head -10
}

# 3. Is there a GPU at all? (The test's own clear-error check says why not.)
"$TEST" --gtest_filter='GpuDecoder.WithoutAGpuCreateIsAClearError' >"$OUTDIR/probe.log" 2>&1
if ! grep -q "a GPU is present" "$OUTDIR/probe.log"; then
  grep -iE "no usable GPU|unavailable|unsupported" "$OUTDIR/probe.log" | head -3
  # What a machine without a GPU can still check: the pipeline's clear errors (decode=gpu
  # is `unavailable` naming the CUDA error, GPUDirect `unsupported`, auto takes the CPU)
  # and that the benchmark's --decode gpu stops at once with the same reason.
  PT="not run ($PIPE)"
  BG="not run ($PIPE)"
  if [ "$PIPE" = ok ]; then
    say "pipeline without a GPU: its tests (GPU cases skip) and kvstream-bench pipeline --decode gpu"
    pipeline_tests 'PipelineTest.Auto*:PipelineTest.Gpu*:PipelineTest.DeviceDestination*:PipelineDecodeOn.*'
    store_tests
    PT=$([ $PTEST_RC = 0 ] && [ $STEST_RC = 0 ] && echo "pass, GPU cases skipped" || echo FAIL)
    timeout 60 "$BENCH" pipeline --decode gpu >"$OUTDIR/pipeline-bench.log" 2>&1
    BRC=$?
    grep "kvstream-bench pipeline:" "$OUTDIR/pipeline-bench.log"
    BG=$([ $BRC = 1 ] && grep -q "no usable GPU" "$OUTDIR/pipeline-bench.log" \
         && echo "refused at once (no usable GPU)" || echo "UNEXPECTED (rc $BRC, see pipeline-bench.log)")
  fi
  echo
  echo "| measure | value |"
  echo "| --- | --- |"
  echo "| GPU | none usable: $(grep -ohE "cudaGetDeviceCount failed with [0-9]+ \([A-Za-z]+\)|reports 0 devices|built without CUDA" "$OUTDIR/probe.log" | head -1) |"
  echo "| decoder bit-exact tests | not run (no GPU) |"
  echo "| pipeline and store tests without a GPU | $PT |"
  echo "| kvstream-bench pipeline --decode gpu | $BG |"
  say "NO USABLE GPU: built everything, ran nothing on a device (exit 2)"
  exit 2
fi

# 4. Bit-exactness: every comparison must run (no skips) and pass.
say "bit-exactness tests"
timeout $(( $(left) - 240 > 60 ? $(left) - 240 : 60 )) "$TEST" >"$OUTDIR/test.log" 2>&1
TEST_RC=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|Failure|differ" "$OUTDIR/test.log" | head -40
SKIPS=$(grep -cE '^\[  SKIPPED \] (Geometries|GpuPaged\.(Paged|Enqueue|ACaptured)|Streams/ProgressiveCase\.OnTheGpu)' "$OUTDIR/test.log" || true)
[ "$SKIPS" = 0 ] || { say "comparisons were skipped on a GPU machine: $SKIPS"; TEST_RC=1; }

# 5. Throughput.
say "benchmark: $TOKENS tokens of mistral-7b geometry ($(left)s left)"
timeout $(( $(left) > 30 ? $(left) : 30 )) "$GPU_BENCH" --tokens "$TOKENS" >"$OUTDIR/bench.log" 2>&1
BENCH_RC=$?
grep -E "^BENCH|kvstream-gpu-bench:" "$OUTDIR/bench.log"

# 6. The pipeline's GPU path: its tests, then the pipelined fetch over loopback tcp,
# GPU decode into device memory (2 decoders, 2 streams), and the CPU path for
# comparison when time is left.
PT="not run ($PIPE)"
if [ "$PIPE" = ok ]; then
  say "pipeline tests ($(left)s left)"
  pipeline_tests 'PipelineTest.*:PipelineDecodeOn.*'
  store_tests
  if grep -qE "SKIPPED \] PipelineTest.(GpuFetch|GpuDirectLands)" "$OUTDIR/pipeline-test.log" \
    || grep -qE "SKIPPED \] StoreTest.DeviceKvRefinesOnTheGpu" "$OUTDIR/store-test.log"; then
    PT="FAIL (GPU case skipped on a GPU machine)"
  elif [ $PTEST_RC = 0 ] && [ $STEST_RC = 0 ]; then PT=pass
  elif [ $PTEST_RC = 124 ] || [ $STEST_RC = 124 ]; then PT="FAIL (timed out)"; else PT=FAIL; fi
  [ "${PT%% *}" = FAIL ] && TEST_RC=1
fi
PG="not run ($PIPE_BENCH)"
PC="not run ($PIPE_BENCH)"
pipe_bench() {  # $1 = cpu|gpu; sets PB
  local t=$(( $(left) - 15 ))
  if [ $t -lt 60 ]; then PB="not run (time: $(left)s left)"; return; fi
  say "kvstream-bench pipeline --decode $1: mistral-7b, $PIPE_TOKENS tokens in 512-token chunks, loopback tcp (${t}s)"
  KVSTREAM_TINYLLAMA=$DATA timeout $t "$BENCH" pipeline --data "$DATA" --geometry mistral-7b --tokens "$PIPE_TOKENS" \
    --chunk-tokens 512 --depth 4 --decode-threads 2 --decode "$1" --json "$OUTDIR/pipeline-$1.json" \
    >"$OUTDIR/pipeline-$1.log" 2>&1
  local rc=$?
  grep -E "^(geometry|transfer|decode|pipelined|GPU output)|kvstream-bench pipeline:" "$OUTDIR/pipeline-$1.log"
  local j=$OUTDIR/pipeline-$1.json
  if [ $rc != 0 ] || [ ! -f "$j" ]; then
    PB="FAIL (rc $rc$([ $rc = 124 ] && echo ", timed out"), see pipeline-$1.log)"
    [ $rc = 124 ] || BENCH_RC=1
    return
  fi
  PB="$(jv "$j" pipelined_s) s pipelined; transfer alone $(jv "$j" transfer_s) s, decode alone $(jv "$j" decode_s) s; overlap $(jv "$j" overlap_efficiency)"
  [ "$1" = gpu ] && PB="$PB; paged device KV = CPU decode: $([ "$(jv "$j" gpu_bit_exact)" = true ] && echo yes || echo NO)"
}
if [ "$PIPE_BENCH" = ok ]; then
  pipe_bench gpu; PG=$PB
  pipe_bench cpu; PC=$PB
fi

# 7. The table.
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
echo "| paged device KV (16-token blocks) = CPU decode, NHD / HND | $(val paged_bit_exact_nhd) / $(val paged_bit_exact_hnd) (1 = equal) |"
echo "| progressive stream: base prefix / whole stream = CPU, decode wall | $(val progressive_base_ms) ms = $(val progressive_base_GBps) GB/s / $(val progressive_full_ms) ms = $(val progressive_full_GBps) GB/s |"
echo "| stream-ordered decode into paged NHD blocks ($(val paged_stream_chunks) chunks queued, verdicts by callback) | $(val paged_stream_ms) ms per chunk = $(val paged_stream_GBps) GB/s fp16 |"
echo "| CPU decode, $(val cpu_threads) threads | $(val cpu_decode_ms) ms = $(val cpu_decode_GBps) GB/s |"
echo "| H2D pinned / pageable ($(val copy_bytes) B) | $(val h2d_pinned_GBps) / $(val h2d_pageable_GBps) GB/s |"
echo "| pipeline and store tests (fetch into device memory = CPU fetch: packed, 3 dtypes, 4 levels; paged NHD and HND; GPUDirect landing through a cuda-declaring client; device KV refined from the base to the finest level = CPU decode) | $PT |"
echo "| pipelined fetch, GPU decode into paged device KV ($PIPE_TOKENS tokens mistral-7b, loopback tcp) | $PG |"
echo "| pipelined fetch, CPU decode, 2 threads (same) | $PC |"
say "done"
[ $TEST_RC = 0 ] && [ $BENCH_RC = 0 ] || exit 1
exit 0
