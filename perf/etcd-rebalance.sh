#!/usr/bin/env bash
# What a join leaves behind: examples/etcd_cluster/run.sh (etcd, three nodes, a fourth
# joining, then one killed -9) run twice on the same data, the anchor with the nodes
# keeping the copies of chunks they no longer own (--keep-surplus-copies), then as
# they run by default (dropping them once every member has copied and each owner holds
# the write, and handing it to them first where they lack it). Prints the bytes the
# cluster holds against R copies of the data after the join, after a client whose
# member set missed the join rewrote every chunk to the old members, and after the
# crash; the seconds from the join until every node reported (done copying; and done
# dropping, in the second run); and how many rewritten chunks an up-to-date client
# reads back at their newest write (an owner the anchor copied a chunk to during the
# join keeps serving the older write: it gives up after 20 s), then after the crash.
#
#   perf/etcd-rebalance.sh [build-dir]       CHUNKS (1000) and BYTES (65536) size the data
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CHUNKS=${CHUNKS:-1000} BYTES=${BYTES:-65536}
run() {  # $1: KEEP_SURPLUS; prints "join_ratio behind_ratio crash_ratio settle_seconds newest last newest_seconds"
  local out
  out=$(KEEP_SURPLUS=$1 "$ROOT/examples/etcd_cluster/run.sh" "$BUILD" 2>/dev/null)
  grep -q "$CHUNKS of $CHUNKS chunks read back equal" <<< "$out" || { echo "$out" >&2; exit 1; }
  local ratios settle newest newest_s last
  ratios=$(grep '^held:' <<< "$out" | sed -E 's/.* ([0-9.]+)x R copies.*/\1/' | tr '\n' ' ')
  settle=$(grep '^settled after the join:' <<< "$out" | sed -E 's/.*: ([0-9.]+) s/\1/')
  # The verify after the client behind rewrote every chunk: how many read back newest.
  newest=$(grep -A1 'a member set behind' <<< "$out" | tail -1 | sed -E 's/^([0-9]+) of.*/\1/')
  newest_s=$(grep '^newest writes read back:' <<< "$out" | sed -E 's/.*: ([0-9.]+) s.*/\1/')
  [ "$newest" = "$CHUNKS" ] || newest_s="$newest_s (gave up)"
  # The last verify: after the crash's rebalance.
  last=$(grep 'chunks read back equal' <<< "$out" | tail -1 | sed -E 's/^([0-9]+) of.*/\1/')
  # held is printed after the puts, after the join, after the rewrite and after the crash
  read -r _ join behind crash <<< "$ratios"
  echo "$join $behind $crash $settle $newest $last $newest_s"
}
read -r keep_join keep_behind keep_crash keep_settle keep_newest keep_last keep_newest_s <<< "$(run 1)"
read -r trim_join trim_behind trim_crash trim_settle trim_newest trim_last trim_newest_s <<< "$(run 0)"
echo "etcd rebalance: $CHUNKS chunks of $BYTES bytes, R = 2, 3 nodes + 1 joining, a client behind rewriting every chunk to the 3, then 1 node killed"
printf '| nodes | held after the join / R copies | join -> every report (s) | rewritten chunks read back newest | after (s) | held after the rewrite / R copies | held after the crash / R copies | newest after the crash |\n'
printf '|---|---|---|---|---|---|---|---|\n'
printf '| keep surplus copies (anchor) | %s | %s (copies done) | %s of %s | %s | %s | %s | %s of %s |\n' \
  "$keep_join" "$keep_settle" "$keep_newest" "$CHUNKS" "$keep_newest_s" "$keep_behind" "$keep_crash" "$keep_last" "$CHUNKS"
printf '| drop them, handing writes over (default) | %s | %s (copies and drops done) | %s of %s | %s | %s | %s | %s of %s |\n' \
  "$trim_join" "$trim_settle" "$trim_newest" "$CHUNKS" "$trim_newest_s" "$trim_behind" "$trim_crash" "$trim_last" "$CHUNKS"
