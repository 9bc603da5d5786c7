#!/usr/bin/env bash
# Downloads (here, with network) the .deb files perf/gpu/run.sh needs on the GPU
# machine, which has CUDA, CMake and ninja but none of our Debian packages and no
# network. They land in .debs/ at the repository root (git-ignored); carry that folder
# to the device machine. Debian 12 (bookworm) packages, ~15 MiB.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$ROOT/.debs"
cd "$ROOT/.debs"
pkgs=(
  libfmt-dev libfmt9
  libspdlog-dev libspdlog1.10
  libgtest-dev libgmock-dev
  libzstd-dev libzstd1
  libxxhash-dev libxxhash0
  libcli11-dev nlohmann-json3-dev
  libssl-dev libssl3
  pkgconf pkgconf-bin libpkgconf3
  liburing-dev liburing2   # the tcp backend, for the pipeline benchmark over loopback
)
apt-get download "${pkgs[@]}"
ls -la "$ROOT/.debs"
du -sh "$ROOT/.debs"
