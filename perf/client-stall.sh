#!/usr/bin/env bash
# What a runtime's scheduler thread pays inside the node client's asynchronous gets
# while the client connects again (kvstream-bench client-stall: the node closes idle
# connections; the node goes silent and comes back), with this build's kvstream-bench
# run over an anchor build's libraries (LD_LIBRARY_PATH: the client is a shared
# library, its API unchanged), then over its own, ROUNDS times in turn.
#
#   perf/client-stall.sh ANCHOR_BUILD_DIR [BUILD_DIR]     (ROUNDS=2; extra args: BENCH_ARGS)
set -euo pipefail
anchor=$1 build=${2:-build}
ROUNDS=${ROUNDS:-2}
bench="$build/bin/kvstream-bench"
[ -x "$bench" ] || { echo "no $bench (cmake -DKVSTREAM_BUILD_PERF=ON)" >&2; exit 1; }
[ -e "$anchor/lib/libkvstream_storage.so" ] || { echo "no anchor libraries in $anchor/lib" >&2; exit 1; }
for r in $(seq "$ROUNDS"); do
  for side in anchor this; do
    echo "## round $r, $side client ($([ $side = anchor ] && echo "$anchor" || echo "$build")/lib)"
    if [ $side = anchor ]; then
      LD_LIBRARY_PATH="$anchor/lib" "$bench" client-stall ${BENCH_ARGS:-} 2> /dev/null
    else
      "$bench" client-stall ${BENCH_ARGS:-} 2> /dev/null
    fi
  done
done
