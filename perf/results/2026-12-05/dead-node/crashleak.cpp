// A client on one shared backend that keeps putting 4 MiB values to a node that a
// script kills -9 and restarts; reconnects after each failure. Prints its RSS.
#include <kvstream/storage.hpp>
#include <kvstream/transport.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#include <chrono>
using namespace kvstream;
using C = std::chrono::steady_clock;
static long rss_kb() { std::ifstream f("/proc/self/status"); std::string l; while (std::getline(f, l)) if (l.rfind("VmRSS:",0)==0) return std::stol(l.substr(6)); return -1; }
int main(int argc, char** argv) {
  std::string addr = argv[1], be = argv[2]; int secs = atoi(argv[3]);
  transport::BackendConfig bc; bc.name = be;
  auto backend = transport::create_backend(bc);
  std::shared_ptr<transport::Backend> shared(std::move(*backend));
  storage::ClientConfig cc; cc.address = addr; cc.backend = bc; cc.name_space = "default"; cc.secret = "exp-secret-0123456789";
  std::vector<std::byte> v(4 << 20, std::byte{7});
  const auto end = C::now() + std::chrono::seconds(secs);
  int conns = 0, fails = 0; long puts = 0;
  while (C::now() < end) {
    auto c = storage::Client::connect(cc, shared, C::now() + std::chrono::seconds(2), {});
    if (!c.ok()) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); continue; }
    ++conns;
    for (int k = 0; C::now() < end; ++k) {
      auto t0 = C::now();
      auto s = (*c)->put("ctx", k % 64, 0, v, C::now() + std::chrono::seconds(10));
      if (!s.ok()) { ++fails; printf("put failed after %.0f ms: %s\n", std::chrono::duration<double, std::milli>(C::now() - t0).count(), s.to_string().substr(0, 120).c_str()); break; }
      ++puts;
    }
    auto tc = C::now();
    c->reset();
    const double close_ms = std::chrono::duration<double, std::milli>(C::now() - tc).count();
    if (close_ms > 100) printf("close took %.0f ms\n", close_ms);
    if (conns % 5 == 0) { printf("conns %d fails %d puts %ld rss %ld MB\n", conns, fails, puts, rss_kb() / 1024); fflush(stdout); }
  }
  printf("end: conns %d fails %d puts %ld rss %ld MB\n", conns, fails, puts, rss_kb() / 1024);
}
