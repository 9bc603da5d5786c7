// Helpers of the storage-node tests: a temporary store directory, a node's settings
// and a client of one namespace.
#pragma once

#include <sys/statvfs.h>

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

/// What a namespace quota charges for a context of one clear object of `length`
/// payload bytes and no parts stored under `dir`: the object's file (a 40-byte header
/// and the payload) in whole allocation units of that file system, and two units for
/// the context (its directory and use mark). Worked out here apart from the store's
/// own rule, so the tests check that rule.
inline uint64_t quota_charge(const std::filesystem::path& dir, uint64_t length) {
  struct statvfs vfs {};
  uint64_t unit = 4096;
  if (::statvfs(dir.c_str(), &vfs) == 0 && vfs.f_frsize >= 512 && vfs.f_frsize <= (1u << 20)) unit = vfs.f_frsize;
  return (40 + length + unit - 1) / unit * unit + 2 * unit;
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
