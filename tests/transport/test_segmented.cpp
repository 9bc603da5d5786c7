// Segmented bodies (storage/segmented.cpp) over every backend: a body of many segments
// lands whole with the later ones posted ahead, one buffer or two taking turns where
// `ahead` allows, and a segment whose header is wrong ends the exchange with
// corrupt_data, the posts withdrawn first (the connection ends with them): the memory
// they had is freed at once (ASan watches) while the rest of the body is on its way.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <memory>

#include "storage/protocol.hpp"
#include "tests/transport/tls_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_segmented {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
using transport::test_util::pattern;

namespace {

class Segmented : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto p = transport::test_util::make_backend_pair(transport::test_util::config_for(GetParam()));
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    pair_ = std::move(p).value();
  }
  // Sends `body` from the client as a request of id 7, segment `bad` (0: none) under
  // the wrong index; returns the send's outcome when it is over.
  std::future<Status> send(const MemoryRegion& src, size_t n, uint32_t bad = 0) {
    return std::async(std::launch::async, [this, &src, n, bad] {
      const auto first = data_request_header(7, 0);
      return send_segmented(
          *pair_.client, first, src.span(0, n),
          [bad](uint32_t i) { return data_request_header(7, i == bad ? i + 1 : i); }, deadline_in(5s), {});
    });
  }
  // Receives request 7's body of `n` bytes into `dest` with eight segments posted
  // ahead, `per_segment` for each; then whether a backend that took the posts (all
  // but tcp, which reads in stream order) has ended the connection, as it must after
  // an error: the rest of the body can no longer be received in step.
  Status receive_failing(const MemoryRegion& dest, size_t n, std::chrono::milliseconds per_segment) {
    std::vector<std::byte> h;
    auto first = pair_.server->recv_header(h, deadline_in(10s), {});
    if (!first.ok()) return first.status();
    Status st = recv_segmented(
        *pair_.server, true, 7, n, *first, [&](uint64_t i, uint64_t len) { return dest.span(i * kSegmentBytes, len); },
        [](std::span<std::byte>) {}, per_segment, {}, 8);
    if (!st.ok() && pair_.server_backend->capabilities().backend != "tcp")
      EXPECT_EQ(pair_.server->recv_header(h, deadline_in(10s), {}).status().code(), StatusCode::unavailable);
    return st;
  }
  transport::test_util::BackendPair pair_;
};

TEST_P(Segmented, ABodyLandsWholeWithItsLaterSegmentsPostedAhead) {
  const size_t n = 5 * kSegmentBytes + 12345;
  const auto body = pattern(n, 11);
  std::vector<std::byte> src(body), whole(n), ring(2 * kSegmentBytes), copied;
  auto smr = pair_.client_backend->register_memory(src.data(), n, MemoryType::host);
  auto wmr = pair_.server_backend->register_memory(whole.data(), n, MemoryType::host);
  auto rmr = pair_.server_backend->register_memory(ring.data(), ring.size(), MemoryType::host);
  ASSERT_TRUE(smr.ok() && wmr.ok() && rmr.ok());
  for (uint64_t ahead : {uint64_t(0), uint64_t(1), uint64_t(8)}) {
    SCOPED_TRACE(ahead);
    auto sent = send(*smr, n);
    std::vector<std::byte> h;
    auto first = pair_.server->recv_header(h, deadline_in(10s), {});
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    copied.clear();
    // ahead 1: two buffers in turn, each segment copied out as it lands (a node's put).
    const bool turns = ahead == 1;
    Status st = recv_segmented(
        *pair_.server, true, 7, n, *first,
        [&](uint64_t i, uint64_t len) {
          return turns ? rmr->span((i % 2) * kSegmentBytes, len) : wmr->span(i * kSegmentBytes, len);
        },
        [&](std::span<std::byte> got) { copied.insert(copied.end(), got.begin(), got.end()); }, 10s, {}, ahead);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(sent.get().ok());
    EXPECT_EQ(copied, body);
    if (!turns) EXPECT_EQ(whole, body);
    std::fill(whole.begin(), whole.end(), std::byte{0});
  }
}

TEST_P(Segmented, AWrongSegmentEndsTheExchangeWithItsPostsWithdrawn) {
  const size_t n = 6 * kSegmentBytes;
  std::vector<std::byte> src = pattern(n, 5);
  auto dest = std::make_unique<std::vector<std::byte>>(n);
  auto smr = pair_.client_backend->register_memory(src.data(), n, MemoryType::host);
  auto dmr = pair_.server_backend->register_memory(dest->data(), n, MemoryType::host);
  ASSERT_TRUE(smr.ok() && dmr.ok());
  auto sent = send(*smr, n, 2);
  const Status st = receive_failing(*dmr, n, 10s);
  EXPECT_EQ(st.code(), StatusCode::corrupt_data) << st.to_string();
  { auto released = std::move(*dmr); }  // the registration, then the memory
  dest.reset();
  (void)sent.get();  // segments 3..5 may find no receive: the send ends at its deadline
  pair_.client.reset();
  pair_.server.reset();
}

// The rest of a body that never comes: the segment's wait ends at its deadline, and
// the posts are withdrawn as on any error.
TEST_P(Segmented, ASegmentThatNeverComesEndsTheExchangeWithItsPostsWithdrawn) {
  const size_t n = 3 * kSegmentBytes;
  std::vector<std::byte> src = pattern(kSegmentBytes, 9);
  auto dest = std::make_unique<std::vector<std::byte>>(n);
  auto smr = pair_.client_backend->register_memory(src.data(), src.size(), MemoryType::host);
  auto dmr = pair_.server_backend->register_memory(dest->data(), n, MemoryType::host);
  ASSERT_TRUE(smr.ok() && dmr.ok());
  // The first segment alone, as if its sender stopped there.
  auto sent = std::async(std::launch::async, [&]() -> Status {
    KVS_ASSIGN_OR_RETURN(uint64_t seq, pair_.client->post_send(data_request_header(7, 0), smr->span(0, kSegmentBytes)));
    return pair_.client->wait_sends(seq, deadline_in(10s), {});
  });
  const Status st = receive_failing(*dmr, n, 300ms);
  EXPECT_EQ(st.code(), StatusCode::timed_out) << st.to_string();
  EXPECT_TRUE(sent.get().ok());
  EXPECT_EQ(0, std::memcmp(dest->data(), src.data(), kSegmentBytes));  // the first landed
  { auto released = std::move(*dmr); }
  dest.reset();
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Backends, Segmented, ::testing::ValuesIn(transport::test_util::backend_params()),
                         [](const auto& info) { return info.param; });

}  // namespace kvstream::test_segmented
