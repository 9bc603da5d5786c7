#!/usr/bin/env bash
# Installs kvstream from the build tree into a scratch prefix, then builds and runs
# examples/consumer against that installed package only: once through CMake's
# find_package, once through pkg-config (`--static` when the build is static).
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/examples/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"

pcdir=$(dirname "$(find "$work/prefix" -name kvstream.pc | head -1)")
static=()
if [ -z "$(find "$work/prefix" -name "libkvstream_core.so*" -print -quit)" ]; then
  static=(--static)
fi
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config "${static[@]}" --cflags --libs kvstream)
libdir=$(PKG_CONFIG_PATH="$pcdir" pkg-config --variable=libdir kvstream)
# shellcheck disable=SC2086 # the flags are a word list
c++ -std=c++20 -o "$work/consumer_pc" "$src/examples/consumer/main.cpp" $flags -Wl,-rpath,"$libdir"
"$work/consumer_pc"
echo "install consumers ok (find_package and pkg-config${static:+ --static})"
