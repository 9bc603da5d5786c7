#include <gtest/gtest.h>

#include "kvstream/gpu.hpp"
#include "kvstream/status.hpp"

namespace kvstream::test_status {

namespace {
Result<int> half(int x) {
  if (x % 2) return make_status(StatusCode::invalid_argument, "{} is odd", x);
  return x / 2;
}
Result<int> quarter(int x) {
  KVS_ASSIGN_OR_RETURN(int h, half(x));
  KVS_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}
}  // namespace

TEST(Status, OkAndError) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.to_string(), "ok");
  Status e = make_status(StatusCode::corrupt_data, "chunk {} bad", 3);
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.code(), StatusCode::corrupt_data);
  EXPECT_EQ(e.to_string(), "corrupt_data: chunk 3 bad");
  EXPECT_EQ(e.with_context("fetch").to_string(), "corrupt_data: fetch: chunk 3 bad");
  EXPECT_EQ(fmt::format("{}", e), "corrupt_data: chunk 3 bad");
}

TEST(Status, ResultPropagates) {
  auto q = quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);
  auto bad = quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(bad.status().message(), "3 is odd");
  EXPECT_EQ(bad.value_or(-1), -1);
}

TEST(Status, EveryCodeHasAName) {
  for (int c = 0; c <= int(kLastStatusCode); ++c) EXPECT_NE(status_code_name(StatusCode(c)), "unknown") << c;
  EXPECT_EQ(status_code_name(StatusCode::no_space), "no_space");
  EXPECT_EQ(status_code_name(StatusCode(int(kLastStatusCode) + 1)), "unknown");
}

TEST(Status, ResultFromOkStatusIsAnInternalError) {
  Result<int> r{Status{}};
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::internal);
}

TEST(Gpu, ProbeSaysWhyWhenNoGpu) {
  auto r = gpu::probe_device();
  if (r.ok()) {
    EXPECT_FALSE(r->name.empty());
    EXPECT_GT(r->total_memory, 0u);
  } else {
    // Built without CUDA: unsupported; CUDA but no driver/device (error 35 here): unavailable.
    EXPECT_EQ(r.status().code(), gpu::built_with_cuda() ? StatusCode::unavailable : StatusCode::unsupported);
    EXPECT_FALSE(r.status().message().empty());
  }
}

}  // namespace kvstream::test_status
