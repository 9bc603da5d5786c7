#!/usr/bin/env bash
# Issue 22's TLS figure in one run: kvstream-perf, tcp backend, loopback, 1 MiB
# blocks, one connection (16 in flight), in clear text (the anchor), with TLS 1.3
# in user space (tcp.tls.kernel_tls=false) and with TLS 1.3 as the machine allows
# (kernel TLS where the kernel has the `tls` module, which the log names); then
# `openssl speed -evp aes-256-gcm` on one core as the cipher's limit.
#
#   perf/tls/run.sh [build-dir]     (default: build; RUNS=3 SECS=5)
set -euo pipefail
BUILD=${1:-build}
PERF="$BUILD/bin/kvstream-perf"
SECS=${SECS:-5}
RUNS=${RUNS:-3}
[ -x "$PERF" ] || { echo "build first: $PERF missing" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

# A CA and a server certificate for 127.0.0.1 (the address the client verifies).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=kvstream perf CA" \
  -keyout "$tmp/ca.key" -out "$tmp/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -keyout "$tmp/server.key" -out "$tmp/server.csr" 2>/dev/null
printf "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n" > "$tmp/ext"
openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial -days 2 \
  -extfile "$tmp/ext" -out "$tmp/server.pem" 2>/dev/null
SERVER_TLS=(--transport tcp.tls.enabled=true --transport "tcp.tls.cert_file=$tmp/server.pem"
            --transport "tcp.tls.key_file=$tmp/server.key")
CLIENT_TLS=(--transport tcp.tls.enabled=true --transport "tcp.tls.ca_file=$tmp/ca.pem")

# Gbit/s of one 1 MiB-block run: kvperf "<server args>" "<client args>" (arrays by
# name); the client's output goes to $tmp/client.log.
kvperf() {
  local -n srv_args=$1 cli_args=$2
  rm -f "$tmp/kv.json"
  local port=$((20000 + RANDOM % 20000))
  timeout $((SECS + 60)) "$PERF" --server --client 127.0.0.1 --port $port --max-block 1048576 "${srv_args[@]}" \
    >"$tmp/server.log" 2>&1 &
  sleep 0.5
  timeout $((SECS + 60)) "$PERF" --client 127.0.0.1 --port $port --block 1048576 --batch 16 --seconds "$SECS" \
    --json "$tmp/kv.json" "${cli_args[@]}" >"$tmp/client.log" 2>&1 || { cat "$tmp/client.log" "$tmp/server.log" >&2; exit 1; }
  wait
  python3 -c "import json;print(json.load(open('$tmp/kv.json'))['rows'][0]['bytes_per_s']*8/1e9)"
}
median() { printf "%s\n" "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

NONE=()
SERVER_USER=("${SERVER_TLS[@]}" --transport tcp.tls.kernel_tls=false)
CLIENT_USER=("${CLIENT_TLS[@]}" --transport tcp.tls.kernel_tls=false)
clear=() user=() auto=()
for r in $(seq "$RUNS"); do
  clear+=("$(kvperf NONE NONE)")
  user+=("$(kvperf SERVER_USER CLIENT_USER)")
  auto+=("$(kvperf SERVER_TLS CLIENT_TLS)")
  path=$(grep -o "TLS 1.3 [^)]*" "$tmp/client.log" | head -1 || true)
  echo "run $r: clear ${clear[-1]}, user-space TLS ${user[-1]}, TLS as available ${auto[-1]} Gbit/s" >&2
done
c=$(median "${clear[@]}"); u=$(median "${user[@]}"); a=$(median "${auto[@]}")
speed=$(openssl speed -evp aes-256-gcm -seconds 2 -bytes 16384 2>/dev/null | awk '/^AES-256-GCM|^aes-256-gcm/ {print $NF}')
echo
echo "| path (tcp, loopback, 1 MiB blocks, 1 connection) | Gbit/s (median of $RUNS) | x clear |"
echo "|---|---|---|"
printf "| clear text (anchor) | %.2f | 1.00 |\n" "$c"
printf "| TLS 1.3, user-space record layer | %.2f | %.2f |\n" "$u" "$(awk -v a="$u" -v b="$c" 'BEGIN{print a/b}')"
printf "| TLS 1.3 as available: %s | %.2f | %.2f |\n" "${path:-?}" "$a" "$(awk -v a="$a" -v b="$c" 'BEGIN{print a/b}')"
echo
echo "openssl speed -evp aes-256-gcm, 16 KiB blocks, one core: ${speed:-?} (1000s of bytes/s) = $(awk -v s="${speed%k}" 'BEGIN{printf "%.2f", s*1000*8/1e9}') Gbit/s"
