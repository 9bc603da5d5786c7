#!/usr/bin/env bash
# Builds the fuzz targets (codec and wire protocol) with clang + libFuzzer (ASan, UBSan) in their own
# build directory and runs each for a bounded time, starting from freshly generated
# seed corpora (valid chunks and profiles) plus whatever earlier runs added.
#
#   tests/fuzz/run_fuzz.sh [seconds_per_target=60]
#
# Environment:
#   KVSTREAM_FUZZ_BUILD_DIR  build directory (default: <repo>/build-fuzz)
#   KVSTREAM_FUZZ_CXX        clang++ to use (default: clang++)
#   KVSTREAM_FUZZ_JOBS       build parallelism, and targets fuzzed at once (default: 2)
#   KVSTREAM_FUZZ_TARGETS    targets to run (default: all four)
#
# Exit status: 0 when every target ran its time without a crash, 77 when clang or
# libFuzzer is missing (ctest reports the test as skipped), 1 otherwise. Crash inputs
# are kept as <build>/artifacts/<target>-crash-*; reproduce with <build>/<target> <file>.
set -uo pipefail

SECS="${1:-60}"
case "$SECS" in '' | *[!0-9]*) echo "run_fuzz.sh: seconds must be a whole number, got '$SECS'" >&2; exit 2 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${KVSTREAM_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
CXX_BIN="${KVSTREAM_FUZZ_CXX:-clang++}"
JOBS="${KVSTREAM_FUZZ_JOBS:-2}"
TARGETS="${KVSTREAM_FUZZ_TARGETS:-fuzz_chunk_decoder fuzz_profile_loader fuzz_rans_decoder fuzz_wire_protocol}"

if ! command -v "$CXX_BIN" > /dev/null 2>&1; then
  echo "run_fuzz.sh: SKIP: $CXX_BIN not found (clang is needed for libFuzzer)"
  exit 77
fi
CXX_PATH="$(command -v "$CXX_BIN")"
# libFuzzer present? (Some clang packages ship without it.)
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
printf '#include <cstdint>\n#include <cstddef>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
  > "$probe_dir/probe.cpp"
if ! "$CXX_PATH" -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" > /dev/null 2>&1; then
  echo "run_fuzz.sh: SKIP: $CXX_PATH cannot link -fsanitize=fuzzer,address,undefined (no libFuzzer)"
  exit 77
fi
GEN=()
command -v ninja > /dev/null 2>&1 && GEN=(-G Ninja)

echo "run_fuzz.sh: building in $BUILD with $CXX_PATH (-j$JOBS)"
mkdir -p "$BUILD"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT/tests/fuzz" -B "$BUILD" "${GEN[@]}" -DCMAKE_CXX_COMPILER="$CXX_PATH" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log"; rm -f "$BUILD/CMakeCache.txt"; echo "run_fuzz.sh: configure failed"; exit 1; }
fi
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "$JOBS" --target fuzz_seed_gen $TARGETS || { echo "run_fuzz.sh: build failed"; exit 1; }

SEEDS="$BUILD/seeds"
rm -rf "$SEEDS"
"$BUILD/fuzz_seed_gen" "$SEEDS" || { echo "run_fuzz.sh: seed generation failed"; exit 1; }
mkdir -p "$BUILD/artifacts" "$BUILD/logs"

# One target for SECS seconds; its exit status lands in <logs>/<target>.rc.
fuzz_one() {
  local t="$1" corpus="$BUILD/corpus/$1" log="$BUILD/logs/$1.log"
  mkdir -p "$corpus"
  # Inputs that once crashed a target (tests/fuzz/regressions/<target>/) are read with
  # the corpus, so each run replays them first.
  local regressions=()
  [ -d "$ROOT/tests/fuzz/regressions/$t" ] && regressions=("$ROOT/tests/fuzz/regressions/$t")
  # -max_total_time bounds fuzzing; the outer timeout only guards against a hang
  # in corpus loading or a stuck run.
  timeout --kill-after=10 $((SECS + 120)) "$BUILD/$t" -max_total_time="$SECS" -timeout=20 -rss_limit_mb=2560 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" \
    "$corpus" "$SEEDS/$t" "${regressions[@]}" > "$log" 2>&1
  echo $? > "$BUILD/logs/$t.rc"
}

# libFuzzer runs one process on one core: the targets run JOBS at a time (CI's
# smoke run: four targets on two cores in half the time).
running=0
for t in $TARGETS; do
  echo "run_fuzz.sh: $t for ${SECS}s (log: $BUILD/logs/$t.log)"
  rm -f "$BUILD/logs/$t.rc"
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=0
summary=""
for t in $TARGETS; do
  log="$BUILD/logs/$t.log"
  rc="$(cat "$BUILD/logs/$t.rc" 2> /dev/null || echo lost)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  if [ "$rc" != 0 ]; then
    failed=1
    echo "run_fuzz.sh: $t FAILED (exit $rc); last lines of $log:"
    grep -v '^"' "$log" | tail -40
    ls -1 "$BUILD/artifacts/$t-"* 2> /dev/null | sed 's/^/  artifact: /'
    summary+="  $t: FAILED (exit $rc)"$'\n'
  else
    summary+="  $t: ok, ${execs:-?} executions, ${rate:-?} exec/s"$'\n'
  fi
done
echo "run_fuzz.sh: summary (${SECS}s per target):"
printf '%s' "$summary"
exit "$failed"
