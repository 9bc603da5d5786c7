// Warnings a hostile peer can trigger at will are bounded in lines, not in events.
#include <gtest/gtest.h>

#include "core/rate_limited_log.hpp"

namespace kvstream::test_rate_limited_log {

using kvstream::detail::RateLimitedLog;
using namespace std::chrono_literals;

TEST(RateLimitedLog, OneLinePerIntervalWithCounts) {
  RateLimitedLog::Clock::time_point now{};
  RateLimitedLog log("refused", 10s, [&] { return now; });
  EXPECT_TRUE(log.note("first"));  // the first event is logged at once
  // 1000 events in 25 s of (fake) time: a line when each interval ends, not per event.
  for (int i = 0; i < 1000; ++i) {
    now += 25ms;
    log.note("again");
  }
  EXPECT_EQ(log.total(), 1001u);
  EXPECT_LE(log.lines(), 6u);
  EXPECT_GE(log.lines(), 4u);
  // Nothing held back and the interval not over: flush writes nothing.
  const auto lines = log.lines();
  EXPECT_FALSE(log.flush());
  now += 10s;
  log.flush();
  EXPECT_LE(log.lines(), lines + 1);
}

TEST(RateLimitedLog, HeldBackEventsAreReportedWhenTheIntervalEnds) {
  RateLimitedLog::Clock::time_point now{};
  RateLimitedLog log("refused", 10s, [&] { return now; });
  log.note("a");
  log.note("b");
  log.note("c");
  EXPECT_EQ(log.lines(), 1u);
  EXPECT_FALSE(log.flush());  // the interval is not over
  now += 11s;
  EXPECT_TRUE(log.flush());   // "2 more in the last 11 s"
  EXPECT_EQ(log.lines(), 2u);
  EXPECT_FALSE(log.flush());
}

}  // namespace kvstream::test_rate_limited_log
