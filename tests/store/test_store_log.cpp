// What a host sees in its log when nothing goes wrong: nothing at warn or above. A
// runtime's operators read those lines as faults; a line per fetch that is not one
// (an `internal` error was logged for every fetch, from the placeholder of its result)
// buries the real ones.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "kvstream/kvstream.hpp"
#include "kvstream/log.hpp"
#include "tests/store/store_test_fixture.hpp"

using namespace kvstream;
using namespace kvstream::store_test;

namespace {

// The lines logged at warn or above while it lives.
class WarningsSeen {
 public:
  WarningsSeen() {
    set_log_sink([this](LogLevel level, std::string_view message) {
      if (level < LogLevel::warn) return;
      std::lock_guard lock(mu_);
      lines_.emplace_back(message);
    });
  }
  ~WarningsSeen() { set_log_sink({}); }
  std::vector<std::string> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

// Put, lookup, an adaptive fetch, a fixed-level fetch kept for refinement, both kinds
// of refinement, a plan and a remove, on a healthy node: every call succeeds and none
// logs a warning or an error.
TEST_F(StoreTest, AHealthyStoreLogsNoWarning) {
  use_progressive_profile();
  KvStore store = open(config("quiet"));
  const auto tokens = tokens_from(11);
  auto dest = KvCache::create(kGeom, DType::f16, 480).value();
  WarningsSeen seen;
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
  const auto lines = seen.lines();
  EXPECT_TRUE(lines.empty()) << lines.size() << " lines at warn or above, the first: " << lines.front();
}

}  // namespace
