#!/usr/bin/env bash
# Builds kvstream's libraries as static archives (no tests, examples or tools),
# installs them and builds examples/consumer against the installed package, through
# CMake and through pkg-config --static: the exported link line of a static build
# must carry every private dependency. Not part of `make test` (a second full build
# of the libraries is too long for CI's 2 cores); run by hand:
#   tests/install/static_test.sh [source dir] [scratch dir]
set -euo pipefail
src=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
work=${2:-$(mktemp -d)}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$src" -B "$work/kvstream" -G Ninja -DBUILD_SHARED_LIBS=OFF -DKVSTREAM_BUILD_TESTS=OFF \
  -DKVSTREAM_BUILD_EXAMPLES=OFF -DKVSTREAM_BUILD_PERF=OFF -DKVSTREAM_WITH_PYTHON=OFF "${launcher[@]}" >/dev/null
cmake --build "$work/kvstream" >/dev/null
"$src/tests/install/consumer_test.sh" "$src" "$work/kvstream"
echo "static consumer ok ($work)"
