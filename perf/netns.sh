# Sourced by the shaped-link scripts (perf/pipeline-shaped.sh, perf/adapt/run.sh): two
# network namespaces joined by a veth pair, torn down by an EXIT trap that also stops
# the script's background jobs and removes $tmp. Needs root.
#
#   kvs_netns_pair NS_A NS_B DEV_A DEV_B PREFIX   # PREFIX.1 in NS_A, PREFIX.2 in NS_B (/24)

kvs_netns_drop() {
  ip netns del "$KVS_NS_A" 2>/dev/null || true
  ip netns del "$KVS_NS_B" 2>/dev/null || true
}

kvs_netns_cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  kvs_netns_drop
  [ -n "${tmp:-}" ] && rm -rf "$tmp"
}

kvs_netns_pair() {
  KVS_NS_A=$1 KVS_NS_B=$2
  local dev_a=$3 dev_b=$4 prefix=$5
  trap kvs_netns_cleanup EXIT
  kvs_netns_drop
  ip netns add "$KVS_NS_A" && ip netns add "$KVS_NS_B"
  ip link add "$dev_a" type veth peer name "$dev_b"
  ip link set "$dev_a" netns "$KVS_NS_A" && ip link set "$dev_b" netns "$KVS_NS_B"
  ip -n "$KVS_NS_A" addr add "$prefix.1/24" dev "$dev_a" && ip -n "$KVS_NS_B" addr add "$prefix.2/24" dev "$dev_b"
  for ns in "$KVS_NS_A" "$KVS_NS_B"; do ip -n "$ns" link set lo up; done
  ip -n "$KVS_NS_A" link set "$dev_a" up && ip -n "$KVS_NS_B" link set "$dev_b" up
}
