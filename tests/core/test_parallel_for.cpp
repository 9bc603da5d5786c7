// core/parallel_for.hpp: every index runs exactly once whatever the worker count, the
// error returned is the lowest failing index's, and an exception thrown by a work
// item becomes that item's error instead of ending the process.
#include <gtest/gtest.h>

#include <atomic>
#include <new>
#include <stdexcept>
#include <vector>

#include "core/parallel_for.hpp"

namespace kvstream::test_parallel_for {
namespace {

TEST(ParallelFor, EveryIndexRunsOnceAndTheLowestFailureIsReturned) {
  for (const unsigned threads : {0u, 1u, 3u, 64u}) {
    std::vector<std::atomic<int>> runs(1000);
    const Status st = parallel_for(runs.size(), threads, [&](size_t i) -> Status {
      runs[i].fetch_add(1);
      if (i == 700 || i == 311) return make_status(StatusCode::not_found, "item {}", i);
      return {};
    });
    for (size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << "index " << i << ", " << threads << " workers";
    EXPECT_EQ(st.code(), StatusCode::not_found);
    EXPECT_EQ(st.message(), "item 311");
  }
  EXPECT_TRUE(parallel_for(0, 4, [](size_t) -> Status { return make_status(StatusCode::internal, "never"); }).ok());
}

TEST(ParallelFor, AnExceptionBecomesThatItemsError) {
  std::atomic<int> ran{0};
  const Status st = parallel_for(40, 4, [&](size_t i) -> Status {
    ran.fetch_add(1);
    if (i == 5) throw std::bad_alloc();
    if (i == 9) throw std::runtime_error("bad item");
    return {};
  });
  EXPECT_EQ(ran.load(), 40);
  EXPECT_EQ(st.code(), StatusCode::resource_exhausted) << st.to_string();
  const Status second = parallel_for(40, 4, [](size_t i) -> Status {
    if (i == 9) throw std::runtime_error("bad item");
    return {};
  });
  EXPECT_EQ(second.code(), StatusCode::internal);
  EXPECT_NE(second.message().find("bad item"), std::string::npos) << second.to_string();
}

}  // namespace
}  // namespace kvstream::test_parallel_for
