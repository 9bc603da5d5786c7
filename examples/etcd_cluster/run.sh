#!/usr/bin/env bash
# A storage cluster whose membership lives in etcd, on loopback: etcd and three
# kvstream-server nodes start, chunks are written, a fourth node joins (the nodes copy
# it its share, and the old owners then drop their copies of it), a client that missed
# the join rewrites every chunk to the old members (they hand the writes to the
# chunks' owners), one node is killed -9 (the survivors restore two replicas of its
# chunks), and every chunk reads back equal (its newest write) after each step; what
# the nodes hold is printed after each.
#
#   examples/etcd_cluster/run.sh <build-dir>      (exit 77 when etcd is not installed)
#
# CHUNKS (200) and BYTES (32768) size the data; KEEP_SURPLUS=1 starts the nodes with
# --keep-surplus-copies (perf/etcd-rebalance.sh compares the two).
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
ETCD=$(command -v etcd || true)
[ -n "$ETCD" ] || { echo "etcd is not installed (Debian package etcd-server): skipped"; exit 77; }
CHUNKS=${CHUNKS:-200}
BYTES=${BYTES:-32768}
node_flags=()
wait_flags=(--trimmed)
if [ "${KEEP_SURPLUS:-0}" = 1 ]; then node_flags=(--keep-surplus-copies); wait_flags=(); fi
SERVER=$BUILD/bin/kvstream-server
CLIENT=$BUILD/bin/kvstream-etcd-example
WORK=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

client_port=$(free_port); peer_port=$(free_port)
URL=http://127.0.0.1:$client_port
"$ETCD" --name ex --data-dir "$WORK/etcd" --listen-client-urls "$URL" --advertise-client-urls "$URL" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "ex=http://127.0.0.1:$peer_port" --logger zap --log-outputs "$WORK/etcd.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf -X POST "$URL/v3/kv/range" -d '{"key":"AA=="}' > /dev/null && break; sleep 0.1; done

echo '{"tenant-a": "0123456789abcdef-example"}' > "$WORK/secrets.json"
declare -A node_pid
start_node() {  # $1: name
  mkdir -p "$WORK/$1"
  "$SERVER" --listen 127.0.0.1:$(free_port) --dir "$WORK/$1" --secrets "$WORK/secrets.json" --etcd "$URL" \
    --replication 2 --lease-ttl-s 2 "${node_flags[@]}" > "$WORK/$1.out" 2> "$WORK/$1.log" &
  node_pid[$1]=$!
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$WORK/$1.out" && break; sleep 0.1; done
  echo "node $1: $(cat "$WORK/$1.out")"
}

data=(--chunks "$CHUNKS" --bytes "$BYTES")
for n in a b c; do start_node $n; done
"$CLIENT" wait --etcd "$URL" --members 3 "${wait_flags[@]}"
"$CLIENT" put --etcd "$URL" "${data[@]}"
"$CLIENT" held --etcd "$URL" "${data[@]}"
echo "--- node d joins"
t0=$(date +%s.%N)
start_node d
"$CLIENT" wait --etcd "$URL" --members 4 "${wait_flags[@]}"
echo "settled after the join: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s"
"$CLIENT" held --etcd "$URL" "${data[@]}"
"$CLIENT" verify --etcd "$URL" "${data[@]}"
echo "--- a client whose member set is behind (a, b, c: it missed d's join) rewrites every chunk"
behind=$(for n in a b c; do sed -n 's/^listening on //p' "$WORK/$n.out"; done | paste -sd,)
"$CLIENT" put --etcd "$URL" "${data[@]}" --generation 1 --nodes "$behind"
t0=$(date +%s.%N)
# The nodes hand the writes of chunks they no longer own to the owners; with
# --keep-surplus-copies the owners keep serving the older writes of those chunks.
"$CLIENT" verify --etcd "$URL" "${data[@]}" --generation 1 --wait-s 20 || [ "${KEEP_SURPLUS:-0}" = 1 ]
echo "newest writes read back: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s after the put"
"$CLIENT" wait --etcd "$URL" --members 4 "${wait_flags[@]}"
"$CLIENT" held --etcd "$URL" "${data[@]}"
echo "--- node b is killed -9 (it leaves when its 2 s lease runs out)"
kill -9 "${node_pid[b]}"
"$CLIENT" verify --etcd "$URL" "${data[@]}" --generation 1 || [ "${KEEP_SURPLUS:-0}" = 1 ]
"$CLIENT" wait --etcd "$URL" --members 3 "${wait_flags[@]}"
"$CLIENT" held --etcd "$URL" "${data[@]}"
"$CLIENT" verify --etcd "$URL" "${data[@]}" --generation 1 || [ "${KEEP_SURPLUS:-0}" = 1 ]
