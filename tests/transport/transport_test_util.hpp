// Helpers shared by the transport test files.
#pragma once

#include <algorithm>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "kvstream/transport.hpp"

namespace kvstream::transport::test_util {

/// Deterministic pseudo-random bytes (xorshift), different per seed.
inline std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = std::byte(x);
  }
  return v;
}

/// True when `name` is built into this kvstream.
inline bool backend_built(const std::string& name) {
  const auto v = available_backends();
  return std::find(v.begin(), v.end(), name) != v.end();
}

/// Two backends of one configuration, a listener and a connected pair.
struct BackendPair {
  std::unique_ptr<Backend> server_backend, client_backend;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> server, client;
};

inline Result<BackendPair> make_backend_pair(const BackendConfig& cfg) {
  using namespace std::chrono_literals;
  BackendPair p;
  KVS_ASSIGN_OR_RETURN(p.server_backend, create_backend(cfg));
  KVS_ASSIGN_OR_RETURN(p.client_backend, create_backend(cfg));
  KVS_ASSIGN_OR_RETURN(p.listener, p.server_backend->listen("127.0.0.1:0"));
  auto accepted = std::async(std::launch::async, [&] { return p.listener->accept(deadline_in(10s), {}); });
  KVS_ASSIGN_OR_RETURN(p.client, p.client_backend->connect(p.listener->address(), deadline_in(10s), {}));
  auto srv = accepted.get();
  if (!srv.ok()) return srv.status();
  p.server = std::move(srv).value();
  return p;
}

}  // namespace kvstream::transport::test_util
