// What a host sees in its log when nothing goes wrong: nothing at warn or above. A
// runtime's operators read those lines as faults; a line per fetch that is not one
// (an `internal` error was logged for every fetch, from the placeholder of its result)
// buries the real ones.
#include <gtest/gtest.h>

#include "kvstream/kvstream.hpp"
#include "tests/store/store_test_fixture.hpp"
#include "tests/support/log_capture.hpp"

using namespace kvstream;
using namespace kvstream::store_test;

namespace {

// Put, lookup, an adaptive fetch, a fixed-level fetch kept for refinement, both kinds
// of refinement, a plan and a remove, on a healthy node: every call succeeds and none
// logs a warning or an error.
TEST_F(StoreTest, AHealthyStoreLogsNoWarning) {
  use_progressive_profile();
  KvStore store = open(config("quiet"));
  const auto tokens = tokens_from(11);
  auto dest = KvCache::create(kGeom, DType::f16, 480).value();
  kvstream::testing::LogCapture log;
  ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
  ASSERT_EQ(store.lookup(tokens, soon()).value(), 480u);
  const std::span<const Token> stored(tokens.data(), 480);
  ASSERT_TRUE(store.plan(stored, soon()).ok());
  {
    auto f = store.fetch(stored, {.host = dest.view()}, soon());
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    ASSERT_TRUE(f->wait().ok());
  }
  {
    FetchOptions o;
    o.level = 2;
    o.keep_for_refinement = true;
    auto f = store.fetch(stored, {.host = dest.view()}, soon(), o);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    ASSERT_TRUE(f->wait().ok());
    ASSERT_TRUE(f->refine_within(std::chrono::seconds(100), soon()).ok());
    ASSERT_TRUE(f->refine(0, soon()).ok());
  }
  ASSERT_TRUE(store.remove(stored, soon()).ok());
  const auto lines = log.warnings();
  EXPECT_TRUE(lines.empty()) << lines.size() << " lines at warn or above, the first: " << lines.front();
}

}  // namespace
