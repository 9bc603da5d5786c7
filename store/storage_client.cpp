#include "store/storage_client.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvstream/cluster.hpp"
#include "kvstream/paced_client.hpp"
#include "kvstream/redis_storage.hpp"

namespace kvstream::store {

Result<std::unique_ptr<storage::Client>> connect_storage(const StorageSettings& s, transport::Deadline deadline) {
  std::unique_ptr<storage::Client> client;
  if (s.kind == "node") {
    storage::ClientConfig c;
    c.address = s.address;
    c.backend.name = s.backend;
    c.backend.tcp.tls = s.tls;
    c.name_space = s.name_space;
    c.secret = s.secret;
    c.connections = s.connections;
    KVS_ASSIGN_OR_RETURN(client, storage::Client::connect(c, deadline));
  } else if (s.kind == "cluster") {
    cluster::ClusterConfig c;
    c.nodes = s.nodes;
    c.etcd.endpoints = s.etcd;
    c.etcd.prefix = s.etcd_prefix;
    c.replication = s.replication;
    c.backend.name = s.backend;
    c.backend.tcp.tls = s.tls;
    c.name_space = s.name_space;
    c.secret = s.secret;
    c.connections_per_node = s.connections;
    c.connect_timeout = s.connect_timeout;
    KVS_ASSIGN_OR_RETURN(client, cluster::connect(c, deadline));
  } else if (s.kind == "redis" || s.kind == "redis-cluster") {
    redis::RedisConfig c;
    c.address = s.address;
    c.cluster = s.kind == "redis-cluster";
    c.seeds = s.nodes;  // more cluster nodes to learn the topology from
    c.password = s.secret;
    c.name_space = s.name_space;
    c.connections = s.connections;
    c.connect_timeout = s.connect_timeout;
    c.tls = s.tls;
    c.at_rest = s.at_rest;
    c.read_clear_values = s.redis_read_clear_values;
    KVS_ASSIGN_OR_RETURN(client, redis::connect(c, deadline));
  } else {
    return make_status(StatusCode::invalid_argument, "storage.kind '{}' is not node, cluster or redis", s.kind);
  }
  if (s.paced_bits_per_second > 0) {
    storage::PacedClientConfig p;
    p.bits_per_second = s.paced_bits_per_second;
    KVS_ASSIGN_OR_RETURN(client, storage::make_paced_client(std::move(client), p));
  }
  return client;
}

std::string storage_peer(const StorageSettings& s) {
  if (s.kind == "cluster" && !s.etcd.empty()) return fmt::format("cluster:etcd:{}", fmt::join(s.etcd, ","));
  if (s.kind == "cluster") return fmt::format("cluster:{}", fmt::join(s.nodes, ","));
  return fmt::format("{}:{}", s.kind, s.address);
}

}  // namespace kvstream::store
