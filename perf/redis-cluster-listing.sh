#!/usr/bin/env bash
# What one eviction listing costs on a Redis Cluster (six redis-servers on loopback,
# three primaries and three replicas, started and stopped here by PID): kvstream-bench
# eviction's listing over SCAN chunks, the anchor (a list, then a stat and a record
# read per chunk) and the usage listing alternated in one process. With several
# binaries (BENCH="old new"), each runs in turn, ROUNDS times, on the same cluster.
#
#   perf/redis-cluster-listing.sh [build-dir] [rounds]     SCAN (2000) chunks
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
SCAN=${SCAN:-2000}
BENCH=${BENCH:-$BUILD/bin/kvstream-bench}
. "$(dirname "$0")/lib/redis_cluster.sh"
start_redis_cluster kvstream-rc-listing
echo "# $(date -u +%FT%TZ) $(nproc) cores; kvstream-bench eviction --scan-chunks $SCAN on a Redis Cluster of 3 primaries"
for r in $(seq "$ROUNDS"); do
  for b in $BENCH; do
    "$b" eviction --redis "${addrs[0]}" --redis-cluster --prompts 2 --requests 2 --scan-chunks "$SCAN" 2>/dev/null \
      | grep -E '^\| (deepest, then oldest stored \(anchor: a list|least recently used \(one usage)|x the anchor.s time' \
      | sed "s|^|round $r $b: |"
  done
done
