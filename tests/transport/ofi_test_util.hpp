// What the libfabric tests share (test_ofi.cpp, test_ofi_peers.cpp): backends of one
// provider, connected pairs, and the fixture of the tests run on each provider (its
// instantiation is in test_ofi.cpp).
#pragma once

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "kvstream/transport.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_ofi {

using namespace kvstream::transport;
using namespace std::chrono_literals;

inline bool have_libfabric() { return test_util::backend_built("libfabric"); }

inline BackendConfig ofi_config(const std::string& provider) {
  BackendConfig cfg;
  cfg.name = "libfabric";
  cfg.libfabric.provider = provider;
  return cfg;
}

inline std::vector<std::byte> fill(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(uint8_t(i * 131 + seed));
  return v;
}

using OfiPair = test_util::BackendPair;

inline Result<OfiPair> make_ofi_pair(const std::string& provider) {
  return test_util::make_backend_pair(ofi_config(provider));
}

/// A connection from `client` to `listener` (into `c`) and the one the listener
/// accepted for it (into `s`). Fatal failures end the calling test.
inline void connect_through(Listener& listener, Backend& client, std::unique_ptr<Connection>& c,
                     std::unique_ptr<Connection>& s) {
  auto acc = std::async(std::launch::async, [&] { return listener.accept(deadline_in(30s), {}); });
  auto made = client.connect(listener.address(), deadline_in(30s), {});
  auto accepted = acc.get();
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  ASSERT_TRUE(accepted.ok()) << accepted.status().to_string();
  c = std::move(made).value();
  s = std::move(accepted).value();
}

class LibfabricProvider : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_libfabric()) GTEST_SKIP() << "libfabric backend not built";
    auto b = create_backend(ofi_config(GetParam()));
    if (!b.ok()) GTEST_SKIP() << "provider " << GetParam() << " not available: " << b.status().to_string();
  }
};

}  // namespace kvstream::test_ofi
