#!/usr/bin/env bash
# The pipeline benchmark across a real shaped link: two network namespaces joined by
# a veth pair with tc tbf (default 3 Gbit/s); kvstream-server in one, kvstream-bench
# pipeline in the other. Needs root.
#
#   perf/pipeline-shaped.sh [build-dir] [extra kvstream-bench pipeline args...]
set -euo pipefail
BUILD=${1:-build}; shift || true
RATE=${RATE:-3gbit}
[ "$(id -u)" = 0 ] || { echo "pipeline-shaped.sh needs root (network namespaces)" >&2; exit 1; }
tmp=$(mktemp -d)
. "$(dirname "${BASH_SOURCE[0]}")/netns.sh"
kvs_netns_pair kvs-pa kvs-pb kvs-pva kvs-pvb 169.254.78
ip netns exec kvs-pa tc qdisc add dev kvs-pva root tbf rate "$RATE" burst 1mb latency 50ms
ip netns exec kvs-pb tc qdisc add dev kvs-pvb root tbf rate "$RATE" burst 1mb latency 50ms
echo '{"bench": "bench-secret-0123456789"}' > "$tmp/secrets.json"
ip netns exec kvs-pa "$BUILD/bin/kvstream-server" --clear-text --listen 169.254.78.1:7471 --dir "$tmp/store" \
  --secrets "$tmp/secrets.json" >/dev/null 2>&1 &
sleep 0.5
echo "== pipeline over veth, tbf $RATE"
ip netns exec kvs-pb "$BUILD/bin/kvstream-bench" pipeline --server 169.254.78.1:7471 "$@"
