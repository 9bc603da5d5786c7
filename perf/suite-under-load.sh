#!/usr/bin/env bash
# Issue 19's flake figure: the whole ctest suite N times in a row while a busy loop
# holds every core, counting failed runs and failed tests. Tests must hold on a loaded
# machine (fake clocks, event order), so any failure here is a bug to chase.
#
#   perf/suite-under-load.sh [build-dir] [runs]      (default: build 20)
#
# A failed run's whole ctest log is kept (its path is printed), so the failure can be
# read afterwards; passed runs' logs are deleted.
set -uo pipefail
BUILD=${1:-build}
RUNS=${2:-20}
JOBS=${JOBS:-2}
cores=$(nproc)
hogs=()
for _ in $(seq "$cores"); do
  ( while :; do :; done ) &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
failed_runs=0
for r in $(seq "$RUNS"); do
  start=$(date +%s)
  log=$(mktemp)
  if ctest --test-dir "$BUILD" -j "$JOBS" --timeout 1200 > "$log" 2>&1; then
    verdict=passed
  else
    verdict=FAILED; failed_runs=$((failed_runs + 1))
  fi
  summary=$(grep -E 'tests passed' "$log" | tail -1)
  echo "run $r: $verdict in $(( $(date +%s) - start )) s: $summary"
  grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|SEGFAULT|Subprocess aborted)\)' "$log" | sed 's/^/    /'
  if [ "$verdict" = passed ]; then rm -f "$log"; else echo "    log kept: $log"; fi
done
echo "$((RUNS - failed_runs)) of $RUNS runs passed with $cores busy loops on $cores cores"
[ "$failed_runs" = 0 ]
