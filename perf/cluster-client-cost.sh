#!/usr/bin/env bash
# What a client of several storage nodes costs, by backend and node count: each
# node's client on a backend of its own (the anchor), all on one shared backend, and
# the replicated client (which shares one). Starts the nodes as separate processes on
# loopback (so the memory measured is the client's), runs `kvstream-bench
# cluster-client` once per mode and prints a markdown table. Modes alternate, twice.
#
#   perf/cluster-client-cost.sh [build dir=build] [backends="tcp ucx libfabric"] [node counts="1 5"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
BACKENDS="${2:-tcp ucx libfabric}"
COUNTS="${3:-1 5}"
SECRET="cluster-client-cost-secret"
WORK="$(mktemp -d /tmp/kvs-cluster-cost-XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo "| backend | nodes | mode | connect, ms | resident after connect, MB | register, ms | first gets, ms | gets again, ms |"
echo "|---|---|---|---|---|---|---|---|"
for backend in $BACKENDS; do
  for n in $COUNTS; do
    nodes=()
    for i in $(seq 1 "$n"); do
      port="$(free_port)"
      mkdir -p "$WORK/$backend-$n-$i"
      KVSTREAM_STORAGE_NAMESPACE=bench KVSTREAM_STORAGE_SECRET="$SECRET" "$BUILD/bin/kvstream-server" \
        --listen "127.0.0.1:$port" --backend "$backend" --dir "$WORK/$backend-$n-$i" > "$WORK/$backend-$n-$i.log" 2>&1 &
      PIDS+=($!)
      nodes+=(--node "127.0.0.1:$port")
    done
    sleep 1.5  # the nodes listening
    for round in 1 2; do
      for mode in own shared cluster; do
        "$BUILD/bin/kvstream-bench" cluster-client --backend "$backend" --mode "$mode" --secret "$SECRET" "${nodes[@]}" \
          2>&1 | grep '^|' || echo "| $backend | $n | $mode | failed (round $round) |"
      done
    done
    for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done
    wait 2> /dev/null || true
    PIDS=()
  done
done
