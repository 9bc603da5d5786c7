# Sourced by the perf scripts that need a Redis Cluster. start_redis_cluster NAME makes
# a directory /tmp/NAME.XXXXXX, starts six redis-servers on free loopback ports under
# it (three primaries, three replicas), creates the cluster and waits until it serves
# every slot; their host:port go to `addrs`. An EXIT trap stops them by PID and
# removes the directory.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
addrs=()
redis_cluster_dir=
stop_redis_cluster() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -z "$redis_cluster_dir" ] || rm -rf "$redis_cluster_dir"
}
start_redis_cluster() {
  local i p bus a
  redis_cluster_dir=$(mktemp -d "/tmp/$1.XXXXXX")
  trap stop_redis_cluster EXIT
  for i in 1 2 3 4 5 6; do
    p=$(free_port); bus=$(free_port); mkdir -p "$redis_cluster_dir/$p"
    redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$redis_cluster_dir/$p/nodes.conf" --cluster-port "$bus" --dir "$redis_cluster_dir/$p" \
      --save "" --appendonly no --repl-diskless-sync-delay 0 --logfile "$redis_cluster_dir/$p/log" --daemonize no &
    pids+=($!); addrs+=("127.0.0.1:$p")
  done
  for a in "${addrs[@]}"; do until redis-cli -p "${a#*:}" ping >/dev/null 2>&1; do sleep 0.1; done; done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  until redis-cli -p "${addrs[0]#*:}" cluster info | grep -q cluster_state:ok; do sleep 0.2; done
}
