#include <kvstream/transport.hpp>
#include <cstdio>
#include <chrono>
using namespace kvstream;
int main(int argc, char** argv) {
  transport::BackendConfig cfg; cfg.name = "libfabric";
  if (argc > 2) cfg.libfabric.provider = argv[2];
  auto b = transport::create_backend(cfg);
  auto t0 = std::chrono::steady_clock::now();
  auto c = (*b)->connect(argv[1], t0 + std::chrono::seconds(atoi(argc > 3 ? argv[3] : "10")), {});
  printf("%s after %.2f s\n", c.ok() ? "connected" : c.status().to_string().c_str(),
         std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count());
}
