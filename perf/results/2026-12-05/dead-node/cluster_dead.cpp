// Times cluster::connect over the given nodes (some may be dead addresses).
#include <kvstream/cluster.hpp>
#include <cstdio>
#include <chrono>
using namespace kvstream;
using C = std::chrono::steady_clock;
int main(int argc, char** argv) {
  cluster::ClusterConfig cfg;
  cfg.backend.name = argv[1];
  for (int i = 2; i < argc; ++i) cfg.nodes.push_back(argv[i]);
  cfg.name_space = "default"; cfg.secret = "exp-secret-0123456789";
  cfg.replication = 2;
  auto t0 = C::now();
  auto c = cluster::connect(cfg, C::now() + std::chrono::seconds(20));
  printf("%s: %s in %.1f ms\n", argv[1], c.ok() ? "connected" : c.status().to_string().c_str(),
         std::chrono::duration<double, std::milli>(C::now() - t0).count());
}
