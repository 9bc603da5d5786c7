// The tests' temporary directories (tests/support/temp_dir.hpp): removed with the
// object, and what a crashed test left behind removed by the next one.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "tests/support/temp_dir.hpp"

namespace kvstream::test_temp_dir {

namespace fs = std::filesystem;
using kvstream::testing::TempDir;

namespace {

/// The pid of a process that has ended (a child reaped at once).
pid_t ended_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(TempDir, IsEmptyAndGoesWithTheObject) {
  fs::path where;
  {
    TempDir d("kvstream-tempdir-own");
    where = d.path();
    ASSERT_TRUE(fs::is_directory(where));
    EXPECT_TRUE(fs::is_empty(where));
    std::ofstream(d / "file") << "x";
    fs::create_directories(d / "sub" / "deeper");
  }
  EXPECT_FALSE(fs::exists(where));
}

// A crashed test's directory (its process ended) goes when the next test of that
// prefix makes one, and so does one named for a running process that started after
// the directory last changed (its pid was reused); a running process's, another
// prefix's and a name that only starts like one stay.
TEST(TempDir, RemovesWhatEndedProcessesLeft) {
  const fs::path tmp = fs::temp_directory_path();
  const pid_t dead = ended_pid();
  const fs::path crashed = tmp / fmt::format("kvstream-tempdir-sweep-{}-3", dead);
  const fs::path crashed_flat = tmp / fmt::format("kvstream-tempdir-sweep-{}", dead);
  const fs::path running = tmp / fmt::format("kvstream-tempdir-sweep-{}-0", ::getppid());
  const fs::path reused = tmp / fmt::format("kvstream-tempdir-sweep-{}-1", ::getppid());
  const fs::path longer = tmp / fmt::format("kvstream-tempdir-sweep-x-{}-0", dead);
  const fs::path other = tmp / fmt::format("kvstream-tempdir-other-{}-0", dead);
  for (const auto& p : {crashed, crashed_flat, running, reused, longer, other}) {
    fs::create_directories(p / "inside");
    std::ofstream(p / "inside" / "f") << "left behind";
  }
  // Last changed long before the parent started: an earlier holder of its pid left it.
  fs::last_write_time(reused, fs::last_write_time(reused) - std::chrono::hours(24 * 365 * 20));
  {
    TempDir d("kvstream-tempdir-sweep");
    EXPECT_FALSE(fs::exists(crashed));
    EXPECT_FALSE(fs::exists(crashed_flat));
    EXPECT_FALSE(fs::exists(reused));
    EXPECT_TRUE(fs::exists(running));
    EXPECT_TRUE(fs::exists(longer));
    EXPECT_TRUE(fs::exists(other));
    EXPECT_TRUE(fs::is_directory(d.path()));
  }
  for (const auto& p : {running, reused, longer, other}) fs::remove_all(p);
}

TEST(TempDir, ReadsTheOwnerFromTheName) {
  using kvstream::testing::temp_dir_detail::owner;
  EXPECT_EQ(owner("kvs-tls-123", "kvs-tls"), 123);
  EXPECT_EQ(owner("kvs-tls-123-7", "kvs-tls"), 123);
  EXPECT_FALSE(owner("kvs-tls-12x", "kvs-tls"));
  EXPECT_FALSE(owner("kvs-tls-", "kvs-tls"));
  EXPECT_FALSE(owner("kvs-tls", "kvs-tls"));
  EXPECT_FALSE(owner("kvs-tlsx-123", "kvs-tls"));
  EXPECT_FALSE(owner("kvs-etcd-nodes-123", "kvs-etcd"));
  EXPECT_FALSE(owner("kvs-tls-0", "kvs-tls"));
}

}  // namespace

}  // namespace kvstream::test_temp_dir
