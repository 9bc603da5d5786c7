// The tests' own way to start services (tests/support/spawn_service.hpp): a service
// is armed to die with the test process, and does not die with the thread that
// happened to start it.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/spawn_service.hpp"
#include "tests/transport/node_test_util.hpp"

namespace kvstream::test_spawn_service {

using kvstream::testing::spawn_service;
using kvstream::storage::node_test_util::TempDir;
namespace fs = std::filesystem;

namespace {

bool have_setpriv() { return ::access("/usr/bin/setpriv", X_OK) == 0; }

// A service started from a short-lived thread (as the node checker restarts its node)
// is still running after the thread has ended: the parent death signal follows the
// thread that started the child, so spawn_service starts them all from one thread that
// lives as long as the process.
TEST(SpawnService, AServiceOutlivesTheThreadThatStartedIt) {
  if (!have_setpriv()) GTEST_SKIP() << "no /usr/bin/setpriv: services are started without a death signal";
  TempDir tmp("kvstream-spawn");
  fs::create_directories(tmp.path());
  pid_t pid = -1, tid = 0;
  std::thread starter([&] {
    tid = ::gettid();
    pid = spawn_service({"/bin/sleep", "600"}, tmp.path() / "sleep.out");
  });
  starter.join();
  ASSERT_GT(pid, 0);
  // The kernel sends a death signal in the thread's exit notification, which has run
  // once the thread is gone from /proc; after that a SIGKILL from it would already be
  // pending in the child, ahead of ours.
  const fs::path task = fmt::format("/proc/self/task/{}", tid);
  while (fs::exists(task)) std::this_thread::yield();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(WTERMSIG(st), SIGTERM) << "the service died with the thread that started it";
}

// The service runs with SIGKILL as its parent death signal, so a test that crashes or
// that ctest kills at its time limit leaves no service behind. The child reports its
// own setting (prctl PR_GET_PDEATHSIG) through Python's ctypes.
TEST(SpawnService, AServiceIsArmedToDieWithTheTest) {
  if (!have_setpriv()) GTEST_SKIP() << "no /usr/bin/setpriv: services are started without a death signal";
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no python3 to read the child's setting";
  TempDir tmp("kvstream-spawn");
  fs::create_directories(tmp.path());
  const fs::path out = tmp.path() / "pdeathsig.out";
  const pid_t pid = spawn_service({"/usr/bin/python3", "-c",
                                   "import ctypes; s = ctypes.c_int(0); "
                                   "ctypes.CDLL(None).prctl(2, ctypes.byref(s)); print(s.value)"},
                                  out);
  ASSERT_GT(pid, 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), fmt::format("{}\n", SIGKILL));
}

// The environment option replaces an inherited entry instead of adding a second one.
TEST(SpawnService, EnvironmentEntriesReplaceInheritedOnes) {
  TempDir tmp("kvstream-spawn");
  fs::create_directories(tmp.path());
  const fs::path out = tmp.path() / "env.out";
  ::setenv("KVSTREAM_SPAWN_TEST", "inherited", 1);
  const pid_t pid = spawn_service({"/bin/sh", "-c", "env | grep '^KVSTREAM_SPAWN_TEST='"}, out,
                                  {.env = {"KVSTREAM_SPAWN_TEST=replaced"}});
  ::unsetenv("KVSTREAM_SPAWN_TEST");
  ASSERT_GT(pid, 0);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "KVSTREAM_SPAWN_TEST=replaced\n");
}

}  // namespace
}  // namespace kvstream::test_spawn_service
