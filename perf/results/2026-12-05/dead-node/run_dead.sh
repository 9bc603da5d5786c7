#!/bin/bash
# run_dead.sh BACKEND: 2 live nodes + 1 dead address; cluster connect, old lib vs new, 3 rounds
B=$1
D=$(mktemp -d); pids=(); addrs=()
for i in 1 2; do
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  mkdir -p $D/n$i
  KVSTREAM_STORAGE_SECRET=exp-secret-0123456789 ${BIN:-build/bin}/kvstream-server --listen 127.0.0.1:$port --backend $B --dir $D/n$i > $D/n$i.log 2>&1 &
  pids+=($!); addrs+=(127.0.0.1:$port)
done
dead=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
sleep 1.5
for r in 1 2 3; do
  for lib in ${OLD_LIB:?the old library folder} ${NEW_LIB:-build/lib}; do
    echo -n "$([ $lib = ${OLD_LIB:?the old library folder} ] && echo old || echo new) "
    KVSTREAM_LOG_LEVEL=error LD_LIBRARY_PATH=$lib ./cluster_dead $B ${addrs[@]} 127.0.0.1:$dead 2>&1 | grep -v "\[info\]"
  done
done
kill ${pids[@]}; wait 2>/dev/null; rm -rf $D
