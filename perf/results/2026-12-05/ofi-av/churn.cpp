// churn: what a listener keeps for clients that came and went. A child process
// listens (libfabric's tcp;ofi_rxm or shm, or the "tcp" or "ucx" backend) and serves each connection one message back;
// the parent connects CLIENTS times, each time from a new backend (so a new client
// endpoint and address, as a new client process has), sends one message, waits for
// the answer and closes. At checkpoints the child reports its resident memory and,
// where the library has it, its address vector's entries (Listener::peer_entries;
// ofi::peers_in_address_vector when measured); before either existed, and for the tcp
// and UCX backends, -1.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kvstream/log.hpp"
#include "kvstream/transport.hpp"
#if __has_include("transport/ofi/ofi_peer_table.hpp")
#define HAVE_PEER_COUNT 1
#else
#define HAVE_PEER_COUNT 0
#endif

using namespace kvstream;
using namespace kvstream::transport;
using namespace std::chrono_literals;

namespace {

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string k;
  long v = -1;
  while (f >> k)
    if (k == "VmRSS:") {
      f >> v;
      break;
    }
  return v;
}

// "tcp" and "ucx" name those backends; anything else is a libfabric provider.
BackendConfig config(const char* provider) {
  BackendConfig cfg;
  const std::string p = provider;
  if (p == "tcp" || p == "ucx") {
    cfg.name = p;
    return cfg;
  }
  cfg.name = "libfabric";
  cfg.libfabric.provider = provider;
  return cfg;
}

// The child: accepts, answers each connection's message, closes it; on a "report"
// message (header "r") writes "rss entries" to `out`.
[[noreturn]] void serve(const char* provider, int addr_fd, int out_fd) {
  set_log_level(LogLevel::warn);
  auto b = create_backend(config(provider));
  if (!b.ok()) std::_Exit(2);
  auto l = (*b)->listen("127.0.0.1:0");
  if (!l.ok()) std::_Exit(3);
  const std::string a = (*l)->address() + "\n";
  (void)!::write(addr_fd, a.data(), a.size());
  for (;;) {
    auto c = (*l)->accept(deadline_in(60s), {});
    if (!c.ok()) std::_Exit(0);
    std::vector<std::byte> h;
    if (!(*c)->recv_header(h, deadline_in(10s), {}).ok() || !(*c)->recv_body({}, deadline_in(10s), {}).ok()) continue;
    if (!h.empty() && h[0] == std::byte('r')) {
      c->reset();
      std::this_thread::sleep_for(200ms);  // the progress thread removes what the closed connection left
      long entries = -1;
#if HAVE_PEER_COUNT
      entries = long((*l)->peer_entries().value_or(uint64_t(-1)));
#endif
      const std::string line = std::to_string(rss_kib()) + " " + std::to_string(entries) + "\n";
      (void)!::write(out_fd, line.data(), line.size());
      continue;
    }
    auto seq = (*c)->post_send(h, {});
    if (seq.ok()) (void)(*c)->wait_sends(*seq, deadline_in(10s), {});
    std::vector<std::byte> bye;
    (void)(*c)->recv_header(bye, deadline_in(2s), {});  // the client's close
  }
}

}  // namespace

int main(int argc, char** argv) {
  set_log_level(LogLevel::warn);
  const char* provider = argc > 1 ? argv[1] : "tcp;ofi_rxm";
  const int clients = argc > 2 ? std::atoi(argv[2]) : 400;
  const int every = argc > 3 ? std::atoi(argv[3]) : 100;
  int addr_pipe[2], out_pipe[2];
  if (::pipe(addr_pipe) || ::pipe(out_pipe)) return 1;
  const pid_t pid = ::fork();
  if (pid == 0) serve(provider, addr_pipe[1], out_pipe[1]);
  char buf[256] = {};
  const ssize_t n = ::read(addr_pipe[0], buf, sizeof buf - 1);
  if (n <= 0) return 1;
  std::string address(buf, size_t(n));
  address.pop_back();
  auto one = [&]() -> bool {
    auto b = create_backend(config(provider));
    if (!b.ok()) return false;
    auto c = (*b)->connect(address, deadline_in(30s), {});
    if (!c.ok()) return std::fprintf(stderr, "connect: %s\n", c.status().to_string().c_str()), false;
    const std::byte h[1] = {std::byte('m')};
    auto seq = (*c)->post_send(h, {});
    if (!seq.ok() || !(*c)->wait_sends(*seq, deadline_in(10s), {}).ok()) return false;
    std::vector<std::byte> back;
    return (*c)->recv_header(back, deadline_in(10s), {}).ok() && (*c)->recv_body({}, deadline_in(10s), {}).ok();
  };
  std::printf("provider\tclients\tnode_rss_kib entries\n");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= clients; ++i) {
    if (!one()) return std::fprintf(stderr, "client %d failed\n", i), 1;
    if (i % every == 0 || i == 10) {
      std::printf("%s\t%d\t", provider, i);
      std::fflush(stdout);
      auto b = create_backend(config(provider));
      auto c = (*b)->connect(address, deadline_in(30s), {});
      const std::byte h[1] = {std::byte('r')};
      auto seq = (*c)->post_send(h, {});
      if (!seq.ok() || !(*c)->wait_sends(*seq, deadline_in(10s), {}).ok()) return 1;
      char line[128] = {};
      const ssize_t m = ::read(out_pipe[0], line, sizeof line - 1);
      if (m <= 0) return 1;
      std::printf("%s", line);
      std::fflush(stdout);
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("# %d clients in %.1f s\n", clients, s);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return 0;
}
