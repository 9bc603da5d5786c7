#!/bin/bash
# kill_clients.sh BACKEND SIZE KILLS: a node stays up; a client putting SIZE-byte values is
# killed -9 after 0.4 s, KILLS times; prints the node's RSS every 10 kills.
B=$1; S=$2; K=$3
D=$(mktemp -d); mkdir -p $D/n
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
KVSTREAM_STORAGE_SECRET=exp-secret-0123456789 ${BIN:-/work/main/build/bin}/kvstream-server --listen 127.0.0.1:$port --backend $B --dir $D/n > $D/n.log 2>&1 & npid=$!
sleep 1
rss() { awk '/VmRSS/ {print int($2/1024)}' /proc/$npid/status; }
echo "kills 0 node rss $(rss) MB"
for i in $(seq $K); do
  ${PUTLOOP:-./putloop} 127.0.0.1:$port $B $S 4 2>/dev/null & c=$!
  sleep 0.4; kill -9 $c; wait $c 2>/dev/null
  [ $((i % 10)) = 0 ] && echo "kills $i node rss $(rss) MB"
done
sleep 2; echo "after 2 s: node rss $(rss) MB"
kill $npid; wait $npid 2>/dev/null; rm -rf $D
