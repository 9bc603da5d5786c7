#!/bin/bash
# run_crashleak.sh BACKEND SECONDS
B=$1; T=$2
D=$(mktemp -d); mkdir -p $D/n
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
start() { KVSTREAM_STORAGE_SECRET=exp-secret-0123456789 ${BIN:-build/bin}/kvstream-server --listen 127.0.0.1:$port --backend $B --dir $D/n > $D/n.log 2>&1 & pid=$!; }
start; sleep 1
KVSTREAM_LOG_LEVEL=${LVL:-warn} LD_LIBRARY_PATH=$CLIB ./crashleak 127.0.0.1:$port $B $T > $D/client.out 2> $D/client.err &
cpid=$!
end=$(( $(date +%s) + T - 3 ))
while [ $(date +%s) -lt $end ]; do sleep 1.2; kill -9 $pid; wait $pid 2>/dev/null; sleep ${DOWN:-0}; start; sleep 0.3; done
wait $cpid; kill $pid 2>/dev/null
cat $D/client.out; echo "unclean closes: $(grep -c 'did not close cleanly' $D/client.err)"; grep -v "did not close" $D/client.err | cut -c1-200 | sort | uniq -c | sort -rn | head -5
rm -rf $D
