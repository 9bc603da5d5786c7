// The storage node a benchmark fetches from (perf/bench.hpp).
#include "perf/bench.hpp"

namespace kvstream::bench {

Result<BenchNode> open_bench_node(const std::string& external, const std::string& backend, const std::string& secret,
                                  const std::string& directory, uint64_t cache_bytes) {
  BenchNode n;
  n.client.backend.name = backend;
  n.client.name_space = "bench";
  n.client.secret = secret;
  if (!external.empty()) {
    n.client.address = external;
    return n;
  }
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.backend.name = backend;
  sc.directory = directory;
  sc.secrets = {{"bench", secret}};
  if (cache_bytes) sc.cache_bytes = cache_bytes;
  KVS_ASSIGN_OR_RETURN(n.server, storage::Server::start(sc));
  n.client.address = n.server->address();
  return n;
}

}  // namespace kvstream::bench
