#!/usr/bin/env bash
# libfabric (tcp;ofi_rxm) with two builds in turn (old, new, old, new, ...): what an
# idle storage node costs, and whether busy endpoints kept their speed. Each round
# measures, per build:
#   idle    CPU ticks (1/100 s) of `kvstream-server --backend libfabric`, no client,
#           over IDLE_SECS after 3 s of start-up
#   4k      kvstream-perf 4 KiB, batch 1: p50 us
#   64k     kvstream-perf 64 KiB, batch 16: GB/s
#   4m      kvstream-perf 4 MiB, batch 16: GB/s
# and prints the medians per build and new/old. transport-anchors.sh has no
# libfabric rows; the old build is this script's anchor.
#
#   perf/ofi-idle-ab.sh OLD_BUILD_DIR NEW_BUILD_DIR      (ROUNDS=2, SECS=2, IDLE_SECS=10)
set -euo pipefail
old=$1 new=$2
ROUNDS=${ROUNDS:-2} SECS=${SECS:-2} IDLE_SECS=${IDLE_SECS:-10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

port() { echo $((47200 + RANDOM % 2000)); }

idle_ticks() {  # build dir
  local dir="$tmp/node" p pid a b
  rm -rf "$dir" && mkdir -p "$dir"
  p=$(port)
  KVSTREAM_STORAGE_SECRET=kvstream-idle-ab-secret "$1/bin/kvstream-server" --backend libfabric \
    --listen "127.0.0.1:$p" --dir "$dir" > "$tmp/node.log" 2>&1 &
  pid=$!
  sleep 3
  a=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  sleep "$IDLE_SECS"
  b=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  kill "$pid"; wait "$pid" 2> /dev/null || true
  echo $((b - a))
}

perf_row() {  # build dir, block, batch, column (3: GB/s, 5: p50 us)
  local p pid
  p=$(port)
  "$1/bin/kvstream-perf" --server --backend libfabric --port "$p" > /dev/null 2>&1 &
  pid=$!
  sleep 1.5
  "$1/bin/kvstream-perf" --client 127.0.0.1 --backend libfabric --port "$p" --block "$2" --batch "$3" \
    --seconds "$SECS" 2> /dev/null | awk -v c="$4" '$1 ~ /^[0-9]+$/ { print $c }'
  wait "$pid" 2> /dev/null || true
}

for r in $(seq "$ROUNDS"); do
  for side in old new; do
    dir=$old; [ "$side" = new ] && dir=$new
    echo "round $r: $side ($dir)" >&2
    echo "$side idle $(idle_ticks "$dir")" >> "$tmp/rows"
    echo "$side 4k $(perf_row "$dir" 4096 1 5)" >> "$tmp/rows"
    echo "$side 64k $(perf_row "$dir" 65536 16 3)" >> "$tmp/rows"
    echo "$side 4m $(perf_row "$dir" 4194304 16 3)" >> "$tmp/rows"
  done
done
python3 - "$tmp/rows" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    side, what, value = line.split()
    rows.setdefault((what, side), []).append(float(value))
print("| measure | old (median) | new (median) | new / old | runs |")
print("|---|---|---|---|---|")
names = {"idle": "idle node, CPU ticks per window", "4k": "4 KiB batch 1, p50 us",
         "64k": "64 KiB batch 16, GB/s", "4m": "4 MiB batch 16, GB/s"}
for what in ("idle", "4k", "64k", "4m"):
    o, n = statistics.median(rows[(what, "old")]), statistics.median(rows[(what, "new")])
    runs = ", ".join(f"{a:g}/{b:g}" for a, b in zip(rows[(what, "old")], rows[(what, "new")]))
    print(f"| {names[what]} | {o:g} | {n:g} | {n / o if o else float('nan'):.2f}x | {runs} |")
PY
