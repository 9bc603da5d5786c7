// A storage client whose connections the node closed (a restart here; its idle timeout
// does the same after a minute without requests) connects again on the next call,
// instead of answering every later call with the lost connection's error.
#include <gtest/gtest.h>

#include "kvstream/storage.hpp"
#include "tests/support/hang_guard.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::storage {
namespace {

using namespace std::chrono_literals;
using node_test_util::connect_client;
using node_test_util::node_config;
using node_test_util::TempDir;
using transport::deadline_in;
using transport::test_util::pattern;

const std::string kSecret = "reconnect-secret-0123456";

TEST(ClientReconnect, ANodeRestartedOnItsAddressIsReachedAgainByTheNextCalls) {
  TempDir dir("kvstream-reconnect");
  auto cfg = node_config(dir.path(), {{"t", kSecret}});
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  cfg.address = (*server)->address();
  auto c = connect_client(cfg.address, "t", kSecret, "tcp", /*connections=*/2);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const auto value = pattern(50000, 7);
  ASSERT_TRUE((*c)->put("ctx", 0, 0, value, deadline_in(10s)).ok());

  (*server)->stop();
  server = Status(StatusCode::unavailable, "stopped");
  // Down: calls fail with a clear error, by their deadline.
  EXPECT_EQ((*c)->stat("ctx", deadline_in(10s)).status().code(), StatusCode::unavailable);

  server = Server::start(cfg);  // the same address and directory
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  // Up again: a call (after the one that may meet the pause between tries) connects,
  // logs in and is served; without reconnecting every call failed from here on.
  int failed = 0;
  ASSERT_TRUE(kvstream::testing::eventually([&] {
    auto st = (*c)->stat("ctx", deadline_in(10s));
    failed += !st.ok();
    return st.ok();
  })) << "the client never reached the restarted node";
  std::vector<std::byte> buf(value.size());
  auto mr = (*c)->register_memory(buf.data(), buf.size());
  ASSERT_TRUE(mr.ok());
  auto n = (*c)->get("ctx", 0, 0, *mr, 0, buf.size(), deadline_in(10s));
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(buf, value);
  // And it keeps working (both its connections were made again).
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*c)->stat("ctx", deadline_in(10s)).ok()) << i;
}

}  // namespace
}  // namespace kvstream::storage
