// Helpers of the storage-node tests: a temporary store directory, a node's settings
// and a client of one namespace.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "kvstream/storage.hpp"
#include "tests/support/temp_dir.hpp"

namespace kvstream::storage::node_test_util {

/// A fresh directory under the system's temporary one, removed with this object.
using kvstream::testing::TempDir;

/// A node on loopback (any port) over `backend`, storing in `dir`.
inline ServerConfig node_config(const std::filesystem::path& dir, std::map<std::string, std::string> secrets,
                                const std::string& backend = "tcp") {
  ServerConfig cfg;
  cfg.address = "127.0.0.1:0";
  cfg.backend.name = backend;
  cfg.directory = dir.string();
  cfg.secrets = std::move(secrets);
  return cfg;
}

/// A client of namespace `ns` on the node at `address`.
inline Result<std::unique_ptr<Client>> connect_client(const std::string& address, const std::string& ns,
                                                      const std::string& secret, const std::string& backend = "tcp",
                                                      uint32_t connections = 1) {
  ClientConfig cc;
  cc.address = address, cc.backend.name = backend, cc.name_space = ns, cc.secret = secret;
  cc.connections = connections;
  return Client::connect(cc, transport::deadline_in(std::chrono::seconds(10)));
}

}  // namespace kvstream::storage::node_test_util
