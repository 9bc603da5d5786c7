#!/usr/bin/env bash
# What a join leaves behind: examples/etcd_cluster/run.sh (etcd, three nodes, a fourth
# joining, then one killed -9) run twice on the same data, the anchor with the nodes
# keeping the copies of chunks they no longer own (--keep-surplus-copies), then as
# they run by default (dropping them once every member has copied and each owner holds
# the write). Prints the bytes the cluster holds against R copies of the data after the
# join and after the crash, and the seconds from the join until every node reported
# (done copying; and done dropping, in the second run).
#
#   perf/etcd-rebalance.sh [build-dir]       CHUNKS (1000) and BYTES (65536) size the data
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CHUNKS=${CHUNKS:-1000} BYTES=${BYTES:-65536}
run() {  # $1: KEEP_SURPLUS; prints "join_ratio crash_ratio settle_seconds"
  local out
  out=$(KEEP_SURPLUS=$1 "$ROOT/examples/etcd_cluster/run.sh" "$BUILD" 2>/dev/null)
  grep -q "$CHUNKS of $CHUNKS chunks read back equal" <<< "$out" || { echo "$out" >&2; exit 1; }
  local ratios settle
  ratios=$(grep '^held:' <<< "$out" | sed -E 's/.* ([0-9.]+)x R copies.*/\1/' | tr '\n' ' ')
  settle=$(grep '^settled after the join:' <<< "$out" | sed -E 's/.*: ([0-9.]+) s/\1/')
  # held is printed after the puts, after the join and after the crash
  read -r _ join crash <<< "$ratios"
  echo "$join $crash $settle"
}
read -r keep_join keep_crash keep_settle <<< "$(run 1)"
read -r trim_join trim_crash trim_settle <<< "$(run 0)"
echo "etcd rebalance: $CHUNKS chunks of $BYTES bytes, R = 2, 3 nodes + 1 joining, then 1 killed"
printf '| nodes | held after the join / R copies | held after the crash / R copies | join -> every report (s) |\n'
printf '|---|---|---|---|\n'
printf '| keep surplus copies (anchor) | %s | %s | %s (copies done) |\n' "$keep_join" "$keep_crash" "$keep_settle"
printf '| drop them (default) | %s | %s | %s (copies and drops done) |\n' "$trim_join" "$trim_crash" "$trim_settle"
