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
dir=$(mktemp -d /tmp/kvstream-rc-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
addrs=()
for i in 1 2 3 4 5 6; do
  p=$(free_port); bus=$(free_port); mkdir -p "$dir/$p"
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" \
    --cluster-port "$bus" --dir "$dir/$p" --save "" --appendonly no --repl-diskless-sync-delay 0 \
    --logfile "$dir/$p/log" --daemonize no &
  pids+=($!); addrs+=("127.0.0.1:$p")
done
for a in "${addrs[@]}"; do until redis-cli -p "${a#*:}" ping >/dev/null 2>&1; do sleep 0.1; done; done
redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
until redis-cli -p "${addrs[0]#*:}" cluster info | grep -q cluster_state:ok; do sleep 0.2; done
echo "# $(date -u +%FT%TZ) $(nproc) cores; kvstream-bench storage --clients 32 --seconds $SECONDS_PER, 1 MiB chunks, 64 distinct"
for r in $(seq "$ROUNDS"); do
  "$BUILD/bin/kvstream-bench" storage --clients 32 --seconds "$SECONDS_PER" 2>/dev/null | sed -n 1,2p | sed "s/^/round $r node: /"
  "$BUILD/bin/kvstream-bench" storage --clients 32 --seconds "$SECONDS_PER" --redis-cluster "${addrs[0]}" 2>/dev/null \
    | sed -n 1,2p | sed "s/^/round $r redis-cluster: /"
done
