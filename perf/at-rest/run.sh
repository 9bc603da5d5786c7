#!/usr/bin/env bash
# Issue 22's figure: encryption at rest costs at most 10% of the storage node's
# 32-client throughput. kvstream-bench storage (32 clients fetching random 1 MiB chunks,
# 64 distinct, tcp on loopback) against a node storing in clear (the anchor) and one
# sealing under a key file, alternating in one run, in two settings:
#   cached:   the node's default cache (256 MiB): after a chunk's first read it is
#             served from memory (plaintext), so encryption costs only that first read;
#   uncached: --cache-mb 0: every fetch reads its chunk from the store, decrypting
#             every block of it (the case the cipher's cost shows in).
#
#   perf/at-rest/run.sh [build-dir] [rounds] [seconds]    (default: build 3 5)
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
SECONDS_PER=${3:-5}
dir=$(mktemp -d /tmp/kvstream-at-rest-bench.XXXXXX)
trap 'rm -rf "$dir"' EXIT
(umask 077 && echo "1 $(openssl rand -hex 32)" >"$dir/keys")

# One run: prints its first output line to stderr, its Gbit/s to stdout.
run() {
  "$BUILD/bin/kvstream-bench" storage --clients 32 --seconds "$SECONDS_PER" --json "$dir/out.json" "$@" 2>/dev/null \
    | sed -n 1p >&2
  python3 -c 'import json, sys; print("%.2f" % json.load(open(sys.argv[1]))["gbit_per_s"])' "$dir/out.json"
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "# $(date -u +%FT%TZ) $(nproc) cores, $(openssl version | cut -d' ' -f1-2); kvstream-bench storage --clients 32" \
  "--seconds $SECONDS_PER, 1 MiB chunks, 64 distinct; $ROUNDS rounds, clear then encrypted in each"
declare -A results
for setting in cached uncached; do
  extra=()
  [ "$setting" = uncached ] && extra=(--cache-mb 0)
  off="" on=""
  for r in $(seq "$ROUNDS"); do
    echo -n "$setting round $r clear: " >&2
    off+="$(run "${extra[@]}") "
    echo -n "$setting round $r encrypted: " >&2
    on+="$(run "${extra[@]}" --at-rest-key-file "$dir/keys") "
  done
  results[$setting]="$off|$on"
done

echo
echo "| node cache | at rest | Gbit/s (per round) | median | encrypted / clear |"
echo "|---|---|---|---|---|"
for setting in cached uncached; do
  off=${results[$setting]%|*} on=${results[$setting]#*|}
  m_off=$(echo "$off" | median) m_on=$(echo "$on" | median)
  ratio=$(awk -v a="$m_on" -v b="$m_off" 'BEGIN {printf "%.3f", a / b}')
  label=$([ "$setting" = cached ] && echo "256 MiB (default)" || echo "0 (every fetch from the store)")
  echo "| $label | clear (anchor) | ${off% } | $m_off | 1 |"
  echo "| $label | AES-256-GCM | ${on% } | $m_on | $ratio |"
done
