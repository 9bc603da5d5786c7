// Storage clients on one transport backend (storage::Client::connect with a backend):
// clients to several nodes share its registrations, keep it alive, and the replicated
// client puts every node's client on its own backend, over each backend built in.
#include <gtest/gtest.h>

#include <cstring>

#include "kvstream/cluster.hpp"
#include "kvstream/storage.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"
#include "transport/common/registration.hpp"

namespace kvstream::test_shared_backend {

using namespace kvstream::storage;
using namespace kvstream::storage::node_test_util;
using namespace kvstream::transport;
using namespace std::chrono_literals;

namespace {

const std::string kSecret = "0123456789abcdef-shared";

// The backend `name`. Under ThreadSanitizer UCX runs over tcp here: with the nodes in
// this process, UCX's shared-memory queues take writes from several nodes' threads,
// ordered by UCX's own atomics, which ThreadSanitizer cannot see (libucp is not
// instrumented), so it reported races inside ucp_dt_pack on the shared segment.
BackendConfig backend_config(const std::string& name) {
  BackendConfig cfg;
  cfg.name = name;
#if defined(__SANITIZE_THREAD__)
  if (name == "ucx") cfg.ucx.tls = "tcp";
#endif
  return cfg;
}

class SharedBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!test_util::backend_built(GetParam())) GTEST_SKIP() << GetParam() << " is not built in";
    for (int i = 0; i < 3; ++i) {
      ServerConfig cfg = node_config(dir_ / fmt::format("node{}", i), {{"t", kSecret}});
      cfg.backend = backend_config(GetParam());
      auto s = Server::start(cfg);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      servers_.push_back(std::move(s).value());
    }
  }

  ClientConfig client_config(size_t node) {
    ClientConfig cc;
    cc.address = servers_[node]->address(), cc.name_space = "t", cc.secret = kSecret;
    return cc;
  }

  TempDir dir_{"kvstream-shared-backend"};
  std::vector<std::unique_ptr<Server>> servers_;
};

// Two clients, to two nodes, on one backend: a buffer registered through one of them
// lands the other's gets, the backend gives both the same registration where it
// caches them (tcp, libfabric; UCX maps a range anew each time), and the clients keep
// the backend alive once the caller lets it go.
TEST_P(SharedBackend, ClientsToTwoNodesShareItsRegistrationsAndKeepItAlive) {
  auto made = create_backend(backend_config(GetParam()));
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::shared_ptr<Backend> backend = std::move(made).value();
  auto a = Client::connect(client_config(0), backend, deadline_in(10s));
  auto b = Client::connect(client_config(1), backend, deadline_in(10s));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ((*a)->capabilities(), &backend->capabilities());
  EXPECT_EQ((*b)->capabilities(), &backend->capabilities());

  const auto va = test_util::pattern(300000, 1), vb = test_util::pattern(200000, 2);
  ASSERT_TRUE((*a)->put("c", 0, 0, va, deadline_in(10s)).ok());
  ASSERT_TRUE((*b)->put("c", 0, 0, vb, deadline_in(10s)).ok());

  std::vector<std::byte> buf(1 << 20);
  auto ra = (*a)->register_memory(buf.data(), buf.size());
  auto rb = (*b)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(ra.ok() && rb.ok());
  if (GetParam() != "ucx")
    EXPECT_EQ(RegionAccess::of(*ra).get(), RegionAccess::of(*rb).get()) << "one registration for both clients";
  backend.reset();  // the clients hold it now

  auto got = (*b)->get("c", 0, 0, *ra, 0, buf.size(), deadline_in(10s));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(*got, vb.size());
  EXPECT_EQ(std::memcmp(buf.data(), vb.data(), vb.size()), 0);
  got = (*a)->get("c", 0, 0, *ra, 0, buf.size(), deadline_in(10s));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(std::memcmp(buf.data(), va.data(), va.size()), 0);

  EXPECT_EQ(Client::connect(client_config(0), nullptr, deadline_in(1s)).status().code(),
            StatusCode::invalid_argument);
}

// The replicated client over three nodes, every node's client on its one backend
// (with libfabric: one endpoint, whose receives each name their node): every chunk
// reads back from its replicas, and again after a node stopped.
TEST_P(SharedBackend, ReplicatedClientReadsEveryChunkBackBeforeAndAfterANodeStops) {
  cluster::ClusterConfig cfg;
  for (auto& s : servers_) cfg.nodes.push_back(s->address());
  cfg.backend = backend_config(GetParam());
  cfg.replication = 2;
  cfg.name_space = "t", cfg.secret = kSecret;
  cfg.connections_per_node = 2;
  cfg.retry_down_after = 10s;
  // Each node's connect within the call's deadline, not the default 2 s: on a loaded
  // host (ctest -j4 under TSan) three in-process libfabric nodes' first handshakes took
  // longer, and what is tested here is the reads.
  cfg.connect_timeout = 10s;
  auto c = cluster::connect(cfg, deadline_in(10s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const uint32_t chunks = 12;
  std::vector<std::vector<std::byte>> stored;
  for (uint32_t k = 0; k < chunks; ++k) {
    stored.push_back(test_util::pattern(50000 + k * 1013, k + 10));
    ASSERT_TRUE((*c)->put("ctx", k, 0, stored.back(), deadline_in(10s)).ok());
  }
  const size_t slot = 64 * 1024;
  std::vector<std::byte> buf(slot * chunks);
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  auto read_all = [&](const char* when) {
    std::memset(buf.data(), 0, buf.size());
    std::vector<std::future<Result<size_t>>> fs;
    for (uint32_t k = 0; k < chunks; ++k) fs.push_back((*c)->get_future("ctx", k, 0, *mr, k * slot, slot, deadline_in(20s)));
    for (uint32_t k = 0; k < chunks; ++k) {
      auto r = fs[k].get();
      ASSERT_TRUE(r.ok()) << when << ", chunk " << k << ": " << r.status().to_string();
      ASSERT_EQ(*r, stored[k].size());
      ASSERT_EQ(std::memcmp(buf.data() + k * slot, stored[k].data(), stored[k].size()), 0) << when << ", chunk " << k;
    }
  };
  read_all("three nodes");
  servers_[1]->stop();
  read_all("after node 1 stopped");
}

INSTANTIATE_TEST_SUITE_P(Backends, SharedBackend, ::testing::Values("tcp", "ucx", "libfabric"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvstream::test_shared_backend
