#!/usr/bin/env bash
# A tenant with a 1 MiB quota stores 1-byte objects until refused (at most LIMIT,
# 20000), on the node binary given; prints objects stored, the disk its directory
# takes (du, blocks) and that against the quota.
#   run.sh KVSTREAM_SERVER TINYPUT [LIMIT]
set -euo pipefail
SERVER=$1 TINYPUT=$2 LIMIT=${3:-20000}
WORK=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; wait 2>/dev/null; rm -rf "$WORK"' EXIT
echo '{"ns": "tinyput-secret-012345"}' > "$WORK/secrets.json"
"$SERVER" --listen 127.0.0.1:0 --dir "$WORK/node" --secrets "$WORK/secrets.json" --namespace-quota-mb 1 \
  > "$WORK/out" 2> "$WORK/log" &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$WORK/out" && break; sleep 0.1; done
addr=$(sed -n 's/^listening on //p' "$WORK/out")
n=$("$TINYPUT" "$addr" tinyput-secret-012345 1 "$LIMIT")
disk=$(du -sB1 "$WORK/node/ns" | cut -f1)
awk -v n="$n" -v d="$disk" 'BEGIN { printf "%d objects of 1 byte stored, the tenant directory takes %d bytes: %.2fx the 1 MiB quota\n", n, d, d / 1048576 }'
