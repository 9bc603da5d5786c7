#!/usr/bin/env bash
# What the per-operation hold on a peer's address-vector entry costs on the libfabric
# send/receive path: kvstream-perf over tcp;ofi_rxm with two builds of
# libkvstream_transport, A (as committed: every post takes a Use of its peer's entry)
# and B (the same tree with the four `op->peer = peers_->hold(...)` lines taken out),
# alternated ROUNDS times; the binary is the same, LD_LIBRARY_PATH picks the library
# (the binaries carry a RUNPATH, which it overrides).
#
#   perf/results/2026-12-05/ofi-av/hold_ab.sh LIB_A LIB_B [build]
set -euo pipefail
A=$1 B=$2 BUILD=${3:-build} ROUNDS=${ROUNDS:-5}
PERF="$BUILD/bin/kvstream-perf"
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
run() {  # lib block batch field
  local port=$((20000 + RANDOM % 20000))
  LD_LIBRARY_PATH=$1 "$PERF" --server --client 127.0.0.1 --port $port --backend libfabric --max-block $2 >/dev/null 2>&1 &
  sleep 0.5
  LD_LIBRARY_PATH=$1 "$PERF" --client 127.0.0.1 --port $port --backend libfabric --block $2 --batch $3 --seconds 2 \
    --json "$tmp/r.json" >/dev/null 2>&1
  wait
  python3 -c "import json;print(json.load(open('$tmp/r.json'))['rows'][0]['$4'])"
}
for spec in "64 1 lat_us_p50" "4096 16 bytes_per_s" "1048576 16 bytes_per_s"; do
  set -- $spec
  : > "$tmp/rows"
  for _ in $(seq "$ROUNDS"); do echo "$(run "$A" "$@") $(run "$B" "$@")" >> "$tmp/rows"; done
  python3 - "$tmp/rows" "$*" <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
a = [r[0] for r in rows]; b = [r[1] for r in rows]
ma, mb = statistics.median(a), statistics.median(b)
print(f"{sys.argv[2]}: A (holds) median {ma:.4g}, B (none) median {mb:.4g}, A/B {ma / mb:.3f}; runs "
      + " ".join(f"{x:.4g}/{y:.4g}" for x, y in rows))
PY
done
