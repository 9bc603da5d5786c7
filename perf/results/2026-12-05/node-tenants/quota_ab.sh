#!/bin/bash
# quota_ab.sh ROUNDS SECS: puts per SECS (4 clients, 64 KiB values, tcp) to a node
# without a quota and to one with --namespace-quota-mb 100000, alternated.
R=${1:-3}; T=${2:-5}
for r in $(seq $R); do
  for q in 0 100000; do
    D=$(mktemp -d); mkdir -p $D/n
    port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    KVSTREAM_STORAGE_SECRET=exp-secret-0123456789 /work/main/build/bin/kvstream-server --listen 127.0.0.1:$port --backend tcp --dir $D/n --namespace-quota-mb $q > $D/n.log 2>&1 & npid=$!
    sleep 0.7
    echo "$r quota_mb=$q puts $(${PUTLOOP:-./putloop} 127.0.0.1:$port tcp 65536 4 $T 2>/dev/null)"
    kill $npid; wait $npid 2>/dev/null; rm -rf $D
  done
done
