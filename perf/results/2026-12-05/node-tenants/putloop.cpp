// A client that puts SIZE-byte values in a loop, with several requests in flight
// (THREADS clients on one backend), until it is killed.
#include <kvstream/storage.hpp>
#include <kvstream/transport.hpp>
#include <chrono>
#include <cstdio>
#include <thread>
#include <atomic>
#include <vector>
using namespace kvstream;
using C = std::chrono::steady_clock;
int main(int argc, char** argv) {
  std::string addr = argv[1], be = argv[2];
  size_t size = std::stoul(argv[3]);
  int threads = argc > 4 ? atoi(argv[4]) : 4;
  const double secs = argc > 5 ? atof(argv[5]) : 1e9;  // run this long, then print the puts made
  const auto end = C::now() + std::chrono::duration_cast<C::duration>(std::chrono::duration<double>(secs));
  std::atomic<long> total{0};
  transport::BackendConfig bc; bc.name = be;
  auto backend = transport::create_backend(bc);
  if (!backend.ok()) return 2;
  std::shared_ptr<transport::Backend> shared(std::move(*backend));
  storage::ClientConfig cc; cc.address = addr; cc.backend = bc; cc.name_space = "default"; cc.secret = "exp-secret-0123456789";
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      std::vector<std::byte> v(size, std::byte(t));
      auto c = storage::Client::connect(cc, shared, C::now() + std::chrono::seconds(5), {});
      if (!c.ok()) { fprintf(stderr, "%s\n", c.status().to_string().c_str()); return; }
      for (long k = 0; C::now() < end; ++k) {
        auto s = (*c)->put("ctx" + std::to_string(t), uint32_t(k % 16), 0, v, C::now() + std::chrono::seconds(10));
        if (!s.ok()) { fprintf(stderr, "%s\n", s.to_string().c_str()); return; }
        ++total;
      }
    });
  for (auto& t : ts) t.join();
  printf("%ld\n", total.load());
}
