#!/usr/bin/env bash
# Issue 22's Redis figure: put and get throughput through one redis-server on loopback,
# in clear, over TLS, and over TLS with values sealed at rest, alternating in one run
# (kvstream-bench storage --redis). The server serves both a clear port and a TLS port
# (tls-auth-clients yes); certificates and the key file are made here with `openssl`.
#
#   perf/redis-tls.sh [build-dir] [rounds] [seconds] [clients] [chunk-bytes]
#                                              (default: build 3 5 8 1048576)
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
SECONDS_PER=${3:-5}
CLIENTS=${4:-8}
CHUNK=${5:-1048576}
dir=$(mktemp -d /tmp/kvstream-redis-tls-bench.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=bench CA" \
  -keyout ca.key -out ca.pem 2>/dev/null
for who in server client; do
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$who" -keyout "$who.key" \
    -out "$who.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > "$who.ext"
  openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile "$who.ext" \
    -out "$who.pem" 2>/dev/null
done
echo "1 $(openssl rand -hex 32)" > keys && chmod 600 keys
cd - >/dev/null

port=$(free_port); tls_port=$(free_port)
redis-server --port "$port" --tls-port "$tls_port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
  --tls-cert-file "$dir/server.pem" --tls-key-file "$dir/server.key" --tls-ca-cert-file "$dir/ca.pem" \
  --tls-auth-clients yes --logfile "$dir/redis.log" --daemonize no &
pid=$!
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done

common=(storage --clients "$CLIENTS" --seconds "$SECONDS_PER" --chunk-bytes "$CHUNK" --put-passes 4)
tls=(--redis "127.0.0.1:$tls_port" --redis-tls-ca "$dir/ca.pem" --redis-tls-cert "$dir/client.pem"
     --redis-tls-key "$dir/client.key")
echo "# $(date -u +%FT%TZ) $(nproc) cores, redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/');" \
     "kvstream-bench ${common[*]}"
for r in $(seq "$ROUNDS"); do
  for mode in clear tls tls+at-rest; do
    case $mode in
      clear) args=(--redis "127.0.0.1:$port") ;;
      tls) args=("${tls[@]}") ;;
      tls+at-rest) args=("${tls[@]}" --redis-at-rest-key-file "$dir/keys") ;;
    esac
    "$BUILD/bin/kvstream-bench" "${common[@]}" "${args[@]}" 2>/dev/null | sed -n '1,2p;4p' | sed "s/^/round $r $mode: /"
  done
done
