// A host takes kvstream's log through a sink: every line, with its level, and only
// those at or above the level in force.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "kvstream/log.hpp"

namespace kvstream::test_log {

namespace {

struct Captured {
  std::vector<std::pair<kvstream::LogLevel, std::string>> lines;
};

// Installs a capturing sink for one test and restores stderr and the level after it.
class LogSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kvstream::set_log_sink([this](kvstream::LogLevel l, std::string_view m) { cap_.lines.emplace_back(l, m); });
  }
  void TearDown() override {
    kvstream::set_log_sink({});
    kvstream::set_log_level(kvstream::LogLevel::info);
  }
  Captured cap_;
};

TEST_F(LogSinkTest, ReceivesLinesWithTheirLevel) {
  kvstream::set_log_level(kvstream::LogLevel::debug);
  KVS_LOG_DEBUG("debug {}", 1);
  KVS_LOG_ERROR("error {}", 2);
  ASSERT_EQ(cap_.lines.size(), 2u);
  EXPECT_EQ(cap_.lines[0].first, kvstream::LogLevel::debug);
  EXPECT_EQ(cap_.lines[0].second, "debug 1");
  EXPECT_EQ(cap_.lines[1].first, kvstream::LogLevel::error);
  EXPECT_EQ(cap_.lines[1].second, "error 2");
}

TEST_F(LogSinkTest, LevelFiltersBeforeTheSink) {
  kvstream::set_log_level(kvstream::LogLevel::warn);
  KVS_LOG_INFO("dropped");
  KVS_LOG_WARN("kept");
  ASSERT_EQ(cap_.lines.size(), 1u);
  EXPECT_EQ(cap_.lines[0].second, "kept");
}

// An error is logged where it is made, once, at a level that follows its code; handing
// it on (copies, with_context, a Result) logs nothing more, and a repeat of a known
// error is not logged.
TEST_F(LogSinkTest, ErrorsAreLoggedOnceWhereTheyAreMade) {
  kvstream::set_log_level(kvstream::LogLevel::debug);
  auto made = [](kvstream::StatusCode c) { return kvstream::make_status(c, "chunk {}", 7); };
  const kvstream::Status io = made(kvstream::StatusCode::io_error);
  ASSERT_EQ(cap_.lines.size(), 1u);
  EXPECT_EQ(cap_.lines[0].first, kvstream::LogLevel::warn);
  EXPECT_EQ(cap_.lines[0].second, "io_error: chunk 7");
  const kvstream::Status passed_on = io.with_context("while reading");
  const kvstream::Result<int> r = passed_on;
  EXPECT_EQ(r.status().message(), "while reading: chunk 7");
  EXPECT_EQ(cap_.lines.size(), 1u);
  (void)made(kvstream::StatusCode::internal);
  (void)made(kvstream::StatusCode::not_found);
  (void)made(kvstream::StatusCode::timed_out);
  ASSERT_EQ(cap_.lines.size(), 4u);
  EXPECT_EQ(cap_.lines[1].first, kvstream::LogLevel::error);
  EXPECT_EQ(cap_.lines[2].first, kvstream::LogLevel::debug);
  EXPECT_EQ(cap_.lines[3].first, kvstream::LogLevel::debug);
  (void)kvstream::detail::repeated_status(kvstream::StatusCode::unavailable, "still broken");
  EXPECT_EQ(cap_.lines.size(), 4u);
  // At the default level, what the caller expects (a miss, a deadline) stays quiet.
  kvstream::set_log_level(kvstream::LogLevel::info);
  (void)made(kvstream::StatusCode::not_found);
  EXPECT_EQ(cap_.lines.size(), 4u);
}

TEST_F(LogSinkTest, ASinkThatThrowsDoesNotEscape) {
  kvstream::set_log_sink([](kvstream::LogLevel, std::string_view) { throw 42; });
  EXPECT_NO_THROW(KVS_LOG_ERROR("into a throwing sink"));
}

TEST(LogLevel, NamesRoundTrip) {
  for (auto l : {kvstream::LogLevel::trace, kvstream::LogLevel::debug, kvstream::LogLevel::info,
                 kvstream::LogLevel::warn, kvstream::LogLevel::error, kvstream::LogLevel::off}) {
    auto parsed = kvstream::parse_log_level(kvstream::log_level_name(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
}

}  // namespace
}  // namespace kvstream::test_log
