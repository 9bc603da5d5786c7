#!/usr/bin/env bash
# Issue 21's throughput figure: 32 clients fetching 1 MiB chunks through a Redis Cluster
# (six redis-servers on loopback, three primaries and three replicas, started and
# stopped here by PID) against the same 32 clients on a native storage node (tcp),
# alternating in one run (kvstream-bench storage).
#
#   perf/redis-cluster-vs-node.sh [build-dir] [rounds] [seconds]    (default: build 3 5)
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
SECONDS_PER=${3:-5}
. "$(dirname "$0")/lib/redis_cluster.sh"
start_redis_cluster kvstream-rc-bench
echo "# $(date -u +%FT%TZ) $(nproc) cores; kvstream-bench storage --clients 32 --seconds $SECONDS_PER, 1 MiB chunks, 64 distinct"
for r in $(seq "$ROUNDS"); do
  "$BUILD/bin/kvstream-bench" storage --clients 32 --seconds "$SECONDS_PER" 2>/dev/null | sed -n 1,2p | sed "s/^/round $r node: /"
  "$BUILD/bin/kvstream-bench" storage --clients 32 --seconds "$SECONDS_PER" --redis-cluster "${addrs[0]}" 2>/dev/null \
    | sed -n 1,2p | sed "s/^/round $r redis-cluster: /"
done
