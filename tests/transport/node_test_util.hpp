// Helpers of the storage-node tests: a temporary store directory, a node's settings
// and a client of one namespace.
#pragma once

#include <atomic>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <unistd.h>

#include "kvstream/storage.hpp"

namespace kvstream::storage::node_test_util {

/// A fresh directory under the system's temporary one, removed with this object.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() / fmt::format("{}-{}-{}", prefix, ::getpid(), counter++);
    std::filesystem::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

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
