#!/bin/bash
# scrape_ab.sh ROUNDS SECS: puts per SECS (4 clients, 64 KiB values, tcp) to a
# kvstream-server with --metrics, alternated in three arms: nothing scraping (0); a
# curl loop every 10 ms against a port where nothing listens (1: the scraper's own
# cost on this 2-core VM, the node answers nothing); the same loop taking /metrics
# (2). Arm 2 against arm 1 is what answering costs the node.
# PUTLOOP: the putloop binary of ../node-tenants (built as its README says).
R=${1:-3}; T=${2:-5}
for r in $(seq $R); do
  for scrape in 0 1 2; do
    D=$(mktemp -d); mkdir -p $D/n
    port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    mport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    KVSTREAM_STORAGE_SECRET=exp-secret-0123456789 /work/main/build/bin/kvstream-server --listen 127.0.0.1:$port \
      --backend tcp --dir $D/n --metrics 127.0.0.1:$mport > $D/n.log 2>&1 & npid=$!
    sleep 0.7
    spid=
    if [ $scrape != 0 ]; then
      target=$mport; [ $scrape = 1 ] && target=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
      (n=0; while true; do curl -s -o /dev/null http://127.0.0.1:$target/metrics; n=$((n+1)); echo $n > $D/scrapes; sleep 0.01; done) & spid=$!
    fi
    puts=$(${PUTLOOP:-./putloop} 127.0.0.1:$port tcp 65536 4 $T 2>/dev/null)
    [ -n "$spid" ] && kill $spid 2>/dev/null && wait $spid 2>/dev/null
    echo "$r scrape=$scrape puts $puts scrapes $(cat $D/scrapes 2>/dev/null || echo 0)"
    kill $npid; wait $npid 2>/dev/null; rm -rf $D
  done
done
