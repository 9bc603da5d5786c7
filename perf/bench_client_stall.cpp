// kvstream-bench client-stall: what a runtime's scheduler thread pays inside the node
// client's asynchronous gets when the client's connections are gone, and how many
// of those gets complete. Two scenes on one node in this process:
//   idle: the node closes idle connections (its idle_timeout); each round waits past
//         it, then issues a batch of gets from one thread, as a scheduler step does;
//   hung: the node is replaced by a socket that takes connections and never answers
//         (a node stopped under the client, a host that hangs), then the node comes
//         back on the same address; the thread issues a get every few milliseconds.
// The figure is the time spent inside get_async calls (the scheduler's stall), and
// the gets that completed. perf/client-stall.sh runs it against an anchor build.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "perf/bench.hpp"

namespace kvstream::bench {

namespace {

using namespace std::chrono_literals;
using transport::Clock;
using transport::deadline_in;

// Counts completions; a waiter sees them all land.
struct Completions {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t done = 0, ok = 0;
  void add(bool good) {
    std::lock_guard lock(mu);
    ++done, ok += good;
    cv.notify_all();
  }
  bool wait_for(uint64_t n, std::chrono::seconds limit) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return done >= n; });
  }
};

// A listening socket that never accepts: connections complete in the kernel's
// backlog and then hear nothing (a node stopped under its clients).
class SilentListener {
 public:
  explicit SilentListener(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd_, 1024) == 0;
  }
  ~SilentListener() { ::close(fd_); }
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

struct Stall {
  std::vector<double> per_round_us;  // time inside get_async calls, each round
  double max_call_us = 0;
  uint64_t calls = 0, ok = 0;
};

// Issues one get, timing the call itself.
double timed_get(storage::Client& c, const transport::MemoryRegion& mr, size_t bytes, uint32_t chunk,
                 transport::Deadline deadline, Completions& done) {
  const auto t0 = Clock::now();
  c.get_async("ctx", chunk, 0, mr, size_t(chunk) * bytes, bytes, deadline, {},
              [&done](Result<size_t> r) { done.add(r.ok()); });
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

}  // namespace

int run_client_stall_bench(const ClientStallBenchOptions& o) {
  const Fail fail{"client-stall"};
  const ScratchDir dir("kvstream-client-stall");
  const std::string secret = "client-stall-secret-0123456789";
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.backend.name = o.backend;
  sc.directory = (dir.path / "store").string();
  sc.secrets = {{"bench", secret}};
  sc.idle_timeout = std::chrono::milliseconds(o.idle_ms);
  auto server = storage::Server::start(sc);
  if (!server.ok()) return fail(server.status());
  const std::string address = (*server)->address();
  const auto port = uint16_t(std::stoi(address.substr(address.rfind(':') + 1)));
  storage::ClientConfig cc;
  cc.address = address, cc.backend.name = o.backend, cc.name_space = "bench", cc.secret = secret;
  cc.connections = o.connections;
  auto client = storage::Client::connect(cc, deadline_in(10s));
  if (!client.ok()) return fail(client.status());
  auto& c = **client;
  const size_t bytes = size_t(o.chunk_kb) << 10;
  std::vector<std::byte> chunk(bytes, std::byte{7}), dest(bytes * o.gets);
  for (uint32_t i = 0; i < o.gets; ++i)
    if (Status s = c.put("ctx", i, 0, chunk, deadline_in(10s)); !s.ok()) return fail(s);
  auto mr = c.register_memory(dest.data(), dest.size());
  if (!mr.ok()) return fail(mr.status());

  // Scene 1: every round after the node closed the connections as idle.
  Stall idle;
  for (uint32_t round = 0; round < o.rounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.idle_ms * 3));
    Completions done;
    double in_calls = 0;
    for (uint32_t i = 0; i < o.gets; ++i) {
      const double us = timed_get(c, *mr, bytes, i, deadline_in(10s), done);
      in_calls += us, idle.max_call_us = std::max(idle.max_call_us, us);
    }
    if (!done.wait_for(o.gets, 30s)) return fail(make_status(StatusCode::timed_out, "gets did not complete"));
    idle.per_round_us.push_back(in_calls), idle.calls += o.gets, idle.ok += done.ok;
  }

  // Scene 2: the node stops answering (a silent listener on its port), then comes
  // back; a get every `gap_ms` throughout.
  Stall hung;
  server->reset();
  Completions done;
  {
    SilentListener silent(port);
    if (!silent.ok()) return fail(make_status(StatusCode::unavailable, "cannot listen on port {} again", port));
    const auto until = Clock::now() + std::chrono::milliseconds(o.hung_ms);
    while (Clock::now() < until) {
      const double us = timed_get(c, *mr, bytes, uint32_t(hung.calls % o.gets),
                                  deadline_in(std::chrono::milliseconds(o.deadline_ms)), done);
      hung.per_round_us.push_back(us), hung.max_call_us = std::max(hung.max_call_us, us), ++hung.calls;
      std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
    }
  }
  if (!done.wait_for(hung.calls, 30s)) return fail(make_status(StatusCode::timed_out, "gets did not complete"));
  hung.ok = done.ok;
  sc.address = address;
  server = storage::Server::start(sc);
  if (!server.ok()) return fail(server.status());
  // From the node's return until a get issued then completes (each try waits for
  // its answer; a failed reconnection's error stands for the client's pause).
  const auto back = Clock::now();
  uint32_t tries = 0;
  double recovery_s = -1;
  for (;;) {
    Completions one;
    const double us = timed_get(c, *mr, bytes, 0, deadline_in(std::chrono::milliseconds(o.deadline_ms)), one);
    hung.max_call_us = std::max(hung.max_call_us, us), ++tries;
    one.wait_for(1, 30s);
    if (one.ok) {
      recovery_s = since(back);
      break;
    }
    if (since(back) > 30) return fail(make_status(StatusCode::timed_out, "the node did not come back in 30 s"));
    std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
  }

  fmt::print("| scene | calls | in calls, median | in calls, max | slowest call | gets ok |\n|---|---|---|---|---|---|\n");
  fmt::print("| idle (a batch of {} gets per round, {} connections, node idle timeout {} ms) | {} | {:.0f} us per round "
             "| {:.0f} us per round | {:.0f} us | {} of {} |\n",
             o.gets, o.connections, o.idle_ms, idle.calls, nearest_rank(idle.per_round_us, 0.5),
             nearest_rank(idle.per_round_us, 1.0), idle.max_call_us, idle.ok, idle.calls);
  double hung_total = 0;
  for (double us : hung.per_round_us) hung_total += us;
  fmt::print("| hung ({} ms silent, a get every {} ms, deadline {} ms) | {} | {:.0f} us per call | {:.0f} us in all "
             "| {:.0f} us | {} of {}; after the node is back, a get completes after {:.3f} s ({} tries) |\n",
             o.hung_ms, o.gap_ms, o.deadline_ms, hung.calls, nearest_rank(hung.per_round_us, 0.5), hung_total,
             hung.max_call_us, hung.ok, hung.calls, recovery_s, tries);
  if (!o.json.empty()) {
    nlohmann::json j;
    j["idle"] = {{"calls", idle.calls},
                 {"round_us_median", nearest_rank(idle.per_round_us, 0.5)},
                 {"round_us_max", nearest_rank(idle.per_round_us, 1.0)},
                 {"max_call_us", idle.max_call_us},
                 {"ok", idle.ok}};
    j["hung"] = {{"calls", hung.calls},
                 {"call_us_median", nearest_rank(hung.per_round_us, 0.5)},
                 {"in_calls_us", hung_total},
                 {"max_call_us", hung.max_call_us},
                 {"ok", hung.ok},
                 {"recovery_s", recovery_s},
                 {"recovery_tries", tries}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace kvstream::bench
