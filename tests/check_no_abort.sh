#!/usr/bin/env bash
# Library code never ends its host's process: no abort, exit, terminate or assert (an
# assert aborts in builds without NDEBUG). A broken invariant is an `internal` error
# and a log line instead. Tools' main files (*_main.cpp) may exit.
set -euo pipefail
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$src"
pattern='(^|[^A-Za-z0-9_.>])(std::)?(abort|exit|_exit|_Exit|quick_exit|terminate|assert)[[:space:]]*\('
hits=$(grep -rnE "$pattern" core codec transport storage policy gpu pipeline store capi python include \
  --include='*.cpp' --include='*.hpp' --include='*.cu' --include='*.cuh' --include='*.h' |
  grep -v '_main\.cpp:' | grep -vE ':[0-9]+:[[:space:]]*//' || true)
if [ -n "$hits" ]; then
  echo "calls that can end the host process in library code:"
  echo "$hits"
  exit 1
fi
echo "no abort/exit/terminate/assert in library code"
