#!/usr/bin/env bash
# UCX connection keys: does the key in every header message cost anything? Runs the
# old build's and the new build's kvstream-perf in turn (old, new, old, new...) on
# the same block sizes, so both meet the same machine moments. Server on CPU 0,
# client on CPU 1: unpinned, the 8-byte round trip over shared memory is bimodal on
# a 2-vCPU VM (0.55 or 1.5 us, run to run). CONFIGS overrides the list.
#   ab.sh OLD_BUILD NEW_BUILD [ROUNDS=5]     prints: round build tls block batch GB/s avg-us p50-us
set -euo pipefail
old=$1 new=$2 rounds=${3:-5}
if [ -n "${CONFIGS:-}" ]; then IFS=';' read -ra CONFIGS <<< "$CONFIGS"
else CONFIGS=("shm,tcp 8 1" "tcp 8 1" "shm,tcp 4096 16" "tcp 4096 16"); fi
run() {  # build tls block batch
  local port; port=$(shuf -i 20000-40000 -n1)
  taskset -c 0 "$1/bin/kvstream-perf" --server --backend ucx --ucx-tls "$2" --port "$port" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  local json; json=$(mktemp)
  taskset -c 1 "$1/bin/kvstream-perf" --client 127.0.0.1 --port "$port" --backend ucx --ucx-tls "$2" --block "$3" \
    --batch "$4" --seconds 3 --json "$json" >/dev/null 2>&1
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"][0]; print("%.4f %.3f %.3f" % (r["bytes_per_s"]/1e9, r["lat_us_avg"], r["lat_us_p50"]))' "$json"
  rm -f "$json"
  wait "$srv" || true
}
for r in $(seq "$rounds"); do
  for side in old new; do
    dir=$old; [ $side = new ] && dir=$new
    for cfg in "${CONFIGS[@]}"; do
      set -- $cfg
      echo "$r $side $1 $2 $3 $(run "$dir" "$1" "$2" "$3")"
    done
  done
done
