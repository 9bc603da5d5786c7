#!/usr/bin/env bash
# The level chooser on a real link whose rate changes. Two network namespaces joined
# by a veth pair; kvstream-server in one, `kvstream-bench adapt` in the other; tc tbf
# on both ends, its rate driven from a bandwidth trace with `tc qdisc change` (tbf
# works here, netem does not). The trace's rates and the times they were set are
# logged; the client records the rate each request really got.
#
#   perf/adapt/run.sh [build-dir] [extra kvstream-bench adapt args...]
#
# Environment: TRACE=random|random-log|steps (default random: 0.1-8 Gbit/s uniform, a
# new rate every 0.5-2 s; random-log: the same range and durations, log-uniform; steps:
# 4 Gbit/s with drops to 0.2 Gbit/s; constant:<bits/s>), SEED, OUT (results
# directory, default perf/results/adapt-<date>). Needs root, gnuplot for the plot.
set -euo pipefail
BUILD=${1:-build}; shift || true
TRACE=${TRACE:-random}
SEED=${SEED:-7}
OUT=${OUT:-perf/results/adapt-$(date +%F)}
[ "$(id -u)" = 0 ] || { echo "perf/adapt/run.sh needs root (network namespaces, tc)" >&2; exit 1; }
[ -x "$BUILD/bin/kvstream-bench" ] || { echo "build first: $BUILD/bin/kvstream-bench missing" >&2; exit 1; }
mkdir -p "$OUT"
tmp=$(mktemp -d)
. "$(dirname "${BASH_SOURCE[0]}")/../netns.sh"
kvs_netns_pair kvs-aa kvs-ab kvs-ava kvs-avb 169.254.79
# The server's egress carries the chunks: that is the link under test. The burst is
# what tbf lets through at line rate after an idle period (1 ms at 8 Gbit/s).
shape() {  # rate in bit/s -> tc
  ip netns exec kvs-aa tc qdisc "$1" dev kvs-ava root tbf rate "$2"bit burst 1mb latency 100ms
}
shape add 1000000000
ip netns exec kvs-ab tc qdisc add dev kvs-avb root tbf rate 10gbit burst 1mb latency 100ms

echo '{"bench": "bench-secret-0123456789"}' > "$tmp/secrets.json"
ip netns exec kvs-aa "$BUILD/bin/kvstream-server" --clear-text --listen 169.254.79.1:7471 --dir "$tmp/store" \
  --secrets "$tmp/secrets.json" --cache-mb 2048 >/dev/null 2>&1 &
sleep 0.5

# The rate driver: a trace of (rate, duration) generated from SEED, applied until the
# client exits; each change logged as "<realtime seconds> <bits/s>".
/usr/bin/python3 - "$TRACE" "$SEED" > "$tmp/trace.txt" <<'EOF'
import math, random, sys
kind, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
for _ in range(20000):
    if kind == "random":
        rate = rng.uniform(0.1e9, 8e9)
        dur = rng.uniform(0.5, 2.0)
    elif kind == "random-log":
        rate = math.exp(rng.uniform(math.log(0.1e9), math.log(8e9)))
        dur = rng.uniform(0.5, 2.0)
    elif kind.startswith("constant:"):  # constant:<bits/s>, for looking at one rate
        rate, dur = float(kind.split(":", 1)[1]), 3600.0
    elif kind == "steps":  # steps: mostly 4 Gbit/s, a drop to 0.2 Gbit/s every ~10 s
        rate, dur = (4e9, rng.uniform(6, 12)) if _ % 2 == 0 else (0.2e9, rng.uniform(1, 3))
    else:
        sys.exit(f"unknown TRACE '{kind}' (random, random-log, steps, constant:<bits/s>)")
    print(f"{rate:.0f} {dur:.3f}")
EOF
(
  while read -r rate dur; do
    shape change "$rate"
    echo "$(date +%s.%N) $rate" >> "$OUT/rates.log"
    sleep "$dur"
  done < "$tmp/trace.txt"
) &
driver=$!
: > "$OUT/rates.log"

echo "== adapt over veth, tbf driven by the '$TRACE' trace (seed $SEED); results in $OUT"
ip netns exec kvs-ab "$BUILD/bin/kvstream-bench" adapt --server 169.254.79.1:7471 --json "$OUT/adapt.json" "$@" \
  | tee "$OUT/table.txt"
kill $driver 2>/dev/null || true

# One stretch of the trace: the link rate as set, the rate each request got, the
# levels our chooser (with ewma) picked per chunk, and each request's time to first
# token against its deadline.
if command -v gnuplot >/dev/null; then
  /usr/bin/python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
j = json.load(open(f"{out}/adapt.json"))
rates = [tuple(map(float, l.split())) for l in open(f"{out}/rates.log") if l.strip()]
reqs = j["requests"]
t0 = reqs[0]["start_wall"]
window = 90.0
with open(f"{out}/plot_rate.dat", "w") as f:
    for i, (t, r) in enumerate(rates):
        if t - t0 > window: break
        t_next = rates[i + 1][0] if i + 1 < len(rates) else t + 1
        f.write(f"{t - t0:.3f} {r / 1e9:.4f}\n{t_next - t0:.3f} {r / 1e9:.4f}\n")
with open(f"{out}/plot_got.dat", "w") as f, open(f"{out}/plot_ttft.dat", "w") as g, \
     open(f"{out}/plot_levels.dat", "w") as h:
    for r in reqs:
        t = r["start_wall"] - t0
        if t > window: break
        if r["delivered_bps"] > 0: f.write(f"{t:.3f} {r['delivered_bps'] / 1e9:.4f}\n")
        if r["config"] == "ours + ewma":
            g.write(f"{t:.3f} {r['ttft_s']:.4f} {r['deadline_s']:.3f} {int(r['violated'])}\n")
            n = max(1, len(r["levels"]))
            for k, lv in enumerate(r["levels"]):
                h.write(f"{t + k * r['ttft_s'] / n:.3f} {lv}\n")
EOF
  gnuplot <<EOF
set terminal pngcairo size 1200,900
set output "$OUT/trace.png"
set multiplot layout 3,1 title "kvstream adapt: one stretch of the '$TRACE' trace"
set xrange [0:90]
set ylabel "Gbit/s"; set logscale y; set key top right
plot "$OUT/plot_rate.dat" with lines lw 2 title "link rate (tbf)", \
     "$OUT/plot_got.dat" with points pt 7 ps 0.4 title "delivered per request"
unset logscale y
set ylabel "level (-1 = text)"; set yrange [-1.5:10.5]
plot "$OUT/plot_levels.dat" with points pt 5 ps 0.5 title "ours + ewma: level per chunk"
set yrange [0:*]; set offsets 0, 0, 0.3, 0; set ylabel "seconds"; set xlabel "time (s)"
plot "$OUT/plot_ttft.dat" using 1:2 with points pt 7 ps 0.6 title "ours + ewma: time to first token", \
     "$OUT/plot_ttft.dat" using 1:3 with lines title "deadline"
unset multiplot
EOF
  rm -f "$OUT"/plot_*.dat
  echo "plot: $OUT/trace.png"
fi
