#!/usr/bin/env bash
# Runs the README's quickstarts as written against a kvstream-server this script
# starts on a free loopback port (and stops by PID). The settings reach them through
# the environment, as the README says.
# usage: run.sh <kvstream-server> <profile> <C++ quickstart binary> [<python> <quickstart.py> <PYTHONPATH>]
set -euo pipefail
server=$1 profile=$2 cpp=$3
if [[ ! -f $profile ]]; then echo "no codec profile at $profile: skipped"; exit 77; fi
dir=$(mktemp -d /tmp/kvstream-quickstart-XXXXXX)
pid=""
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
# The server takes its tenant from the same settings as its clients.
export KVSTREAM_STORAGE_NAMESPACE=quickstart KVSTREAM_STORAGE_SECRET=quickstart-secret-0123
# The log exists before the server starts: the redirection below happens in the
# background child, which a loaded machine may not have run by the first read.
: > "$dir/server.out"
"$server" --listen 127.0.0.1:0 --dir "$dir/node" > "$dir/server.out" 2>&1 &
pid=$!
for _ in $(seq 100); do
  address=$(sed -n 's/^listening on //p' "$dir/server.out")
  [[ -n $address ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/server.out"; exit 1; }
  sleep 0.1
done
[[ -n $address ]] || { echo "kvstream-server did not start"; exit 1; }
export KVSTREAM_STORAGE_ADDRESS=$address KVSTREAM_CODEC_PROFILE=$profile KVSTREAM_CODEC_MODEL_ID=stories260K
out=$("$cpp")
echo "C++: $out"
[[ $out == "512 tokens stored, fetched ok" ]] || { echo "unexpected C++ quickstart output"; exit 1; }
if [[ $# -ge 6 ]]; then
  # A second model id: the Python quickstart stores its own chunks rather than finding the C++ ones.
  out=$(KVSTREAM_CODEC_MODEL_ID=stories260K-py PYTHONPATH=$6 "$4" "$5")
  echo "Python: $out"
  [[ $out == "512 tokens stored, fetched 512" ]] || { echo "unexpected Python quickstart output"; exit 1; }
fi
echo "quickstarts ok"
