#!/usr/bin/env bash
# Behaviour unchanged? Runs perf/transport-anchors.sh with two builds' binaries in
# turn (old, new, old, new, ...), so both meet the same machine moments, and prints
# each anchor ratio per build and new/old. Each run keeps its own anchors (iperf3,
# ucx_perftest), so the ratios compare across runs even when the machine's speed moves.
#
#   perf/transport-ab.sh OLD_BUILD_DIR NEW_BUILD_DIR      (ROUNDS=2, RUNS=3, SECS=5)
#   OUT=dir keeps every run's output (its tables, and each anchor/ours pair on .err).
set -euo pipefail
old=$1 new=$2
ROUNDS=${ROUNDS:-2}
export RUNS=${RUNS:-3} SECS=${SECS:-5}
here=$(cd "$(dirname "$0")" && pwd)
if [ -n "${OUT:-}" ]; then
  out=$OUT; mkdir -p "$out"
else
  out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fi
for r in $(seq "$ROUNDS"); do
  for side in old new; do
    dir=$old; [ $side = new ] && dir=$new
    echo "round $r: $side ($dir)" >&2
    "$here/transport-anchors.sh" "$dir" > "$out/$side.$r.txt" 2> "$out/$side.$r.err" || {
      echo "transport-anchors.sh failed for $dir:" >&2; tail -5 "$out/$side.$r.err" >&2; exit 1; }
  done
done
python3 - "$out" "$ROUNDS" <<'PY'
import re, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def ratios(path):
    rows = {}
    for line in open(path):
        m = re.search(r"ratio (?:median |to iperf3 )?([0-9.]+)", line)
        if not m: continue
        label = re.sub(r"\s+[0-9.]+.*", "", line.split("ratio")[0])
        key = re.sub(r"\s+", " ", label).strip()
        if "ratio to iperf3" in line: key = "veth tbf: kvstream tcp / iperf3"
        rows[key] = float(m.group(1))
    return rows
old = [ratios(f"{out}/old.{r}.txt") for r in range(1, rounds + 1)]
new = [ratios(f"{out}/new.{r}.txt") for r in range(1, rounds + 1)]
print(f"{'anchor ratio (ours / anchor)':<58} {'old runs':>16} {'new runs':>16} {'new/old (medians)':>18}")
for key in old[0]:
    o = [x[key] for x in old if key in x]; n = [x[key] for x in new if key in x]
    if not o or not n: continue
    mo, mn = statistics.median(o), statistics.median(n)
    print(f"{key[:58]:<58} {' '.join(f'{v:.2f}' for v in o):>16} {' '.join(f'{v:.2f}' for v in n):>16} "
          f"{(mn / mo if mo else float('nan')):>18.2f}")
PY
