// A backend's settings are one table: every field settable by name, described with
// its default, and refused with a clear error when the name or value is wrong.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "kvstream/transport_config.hpp"

namespace kvstream::test_backend_config {

using kvstream::StatusCode;
using kvstream::transport::BackendConfig;
using kvstream::transport::MemoryType;

TEST(BackendConfig, SetsEveryKindOfField) {
  BackendConfig c;
  ASSERT_TRUE(c.set("tcp.queue_depth", "128").ok());
  ASSERT_TRUE(c.set("tcp.send_zc=true").ok());
  ASSERT_TRUE(c.set("ucx.tls", "tcp,self").ok());
  ASSERT_TRUE(c.set("ucx.peer_errors", "false").ok());
  ASSERT_TRUE(c.set("ucx.stage_limit_bytes", "1048576").ok());
  ASSERT_TRUE(c.set("libfabric.provider", "shm").ok());
  ASSERT_TRUE(c.set("memory", "cuda").ok());
  EXPECT_EQ(c.tcp.queue_depth, 128u);
  EXPECT_TRUE(c.tcp.send_zc);
  EXPECT_EQ(c.ucx.tls, "tcp,self");
  EXPECT_FALSE(c.ucx.peer_errors);
  EXPECT_EQ(c.ucx.stage_limit_bytes, 1048576u);
  EXPECT_EQ(c.libfabric.provider, "shm");
  EXPECT_EQ(c.memory, MemoryType::cuda);
  EXPECT_EQ(*c.get("tcp.queue_depth"), "128");
  EXPECT_EQ(*c.get("memory"), "cuda");
}

TEST(BackendConfig, RefusesUnknownNamesAndBadValues) {
  BackendConfig c;
  EXPECT_EQ(c.set("tcp.no_such", "1").code(), StatusCode::not_found);
  EXPECT_EQ(c.set("tcp.queue_depth", "many").code(), StatusCode::invalid_argument);
  EXPECT_EQ(c.set("tcp.queue_depth", "-1").code(), StatusCode::invalid_argument);
  EXPECT_EQ(c.set("ucx.peer_errors", "perhaps").code(), StatusCode::invalid_argument);
  EXPECT_EQ(c.set("memory", "disk").code(), StatusCode::invalid_argument);
  EXPECT_EQ(c.set("no equals sign").code(), StatusCode::invalid_argument);
  // A refused value leaves the field as it was.
  EXPECT_EQ(c.tcp.queue_depth, BackendConfig{}.tcp.queue_depth);
}

TEST(BackendConfig, TableListsEveryFieldOnceWithItsDefault) {
  const auto rows = kvstream::transport::backend_settings();
  std::set<std::string> names;
  for (const auto& r : rows) {
    EXPECT_TRUE(names.insert(std::string(r.name)).second) << r.name;
    EXPECT_FALSE(r.doc.empty()) << r.name;
    EXPECT_TRUE(r.env.empty()) << r.name;  // hosts pass settings explicitly
  }
  EXPECT_EQ(rows.size(), 18u);
  BackendConfig c;
  const std::string text = c.describe();
  for (const auto& r : rows) EXPECT_NE(text.find(std::string(r.name) + " = "), std::string::npos) << r.name;
  EXPECT_NE(text.find("libfabric.provider = tcp;ofi_rxm"), std::string::npos);
  EXPECT_NE(text.find("libfabric.peer_timeout_ms = 4000"), std::string::npos) << text;
  ASSERT_TRUE(c.set("libfabric.peer_timeout_ms", "250").ok());
  EXPECT_EQ(c.libfabric.peer_timeout, std::chrono::milliseconds(250));
}

}  // namespace kvstream::test_backend_config
