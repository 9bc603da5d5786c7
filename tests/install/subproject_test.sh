#!/usr/bin/env bash
# kvstream as a subproject leaves its parent alone: configures tests/install/subproject
# (a project that add_subdirectory()s kvstream) and checks that kvstream's tests,
# examples and benchmarks are off, the parent's build type and flags are untouched and
# no output folder was imposed. Configure only: building the libraries again would
# take CI's two cores too long (tests/install/static_test.sh builds by hand).
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake -S "$src/tests/install/subproject" -B "$work" -G Ninja -DKVSTREAM_SOURCE="$src" -DKVSTREAM_WITH_CUDA=OFF \
  -DKVSTREAM_WITH_PYTHON=OFF > "$work.log" 2>&1 || { cat "$work.log"; exit 1; }
cache=$work/CMakeCache.txt
fail() { echo "subproject: $*"; exit 1; }
grep -q '^KVSTREAM_BUILD_TESTS:BOOL=OFF' "$cache" || fail "tests are on"
grep -q '^KVSTREAM_BUILD_EXAMPLES:BOOL=OFF' "$cache" || fail "examples are on"
grep -q '^KVSTREAM_BUILD_PERF:BOOL=OFF' "$cache" || fail "benchmarks are on"
grep -q '^CMAKE_BUILD_TYPE:STRING=$' "$cache" || fail "the build type was set: $(grep '^CMAKE_BUILD_TYPE' "$cache")"
grep -q '^BUILD_SHARED_LIBS' "$cache" && fail "BUILD_SHARED_LIBS was put in the parent's cache"
grep -q 'build parent_app:' "$work/build.ninja" || fail "the parent's target is missing"
grep -q 'build bin/' "$work/build.ninja" && fail "an output folder (bin/) was imposed"
[ -z "$(find "$work/kvstream" -name CTestTestfile.cmake -exec grep -l add_test {} +)" ] || fail "kvstream registered tests"
rm -f "$work.log"
echo "subproject ok"
