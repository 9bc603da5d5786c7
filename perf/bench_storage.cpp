// kvstream-bench storage: a storage node on loopback (or a Redis Cluster, with
// --redis-cluster) under many concurrent clients, each fetching random chunks; reports
// errors and chunk latency percentiles.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvstream/redis_storage.hpp"
#include "kvstream/storage.hpp"
#include "perf/bench.hpp"

namespace kvstream::bench {

using namespace std::chrono_literals;
using transport::Clock;
using transport::deadline_in;

namespace {
// Resident memory of this process (node and clients), from /proc: how "memory stable"
// is checked under load.
uint64_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}
}  // namespace

int run_storage_bench(const StorageBenchOptions& o) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvstream-load-{}", ::getpid());
  fs::remove_all(dir);
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.backend.name = o.backend;
  sc.directory = dir.string();
  sc.secrets = {{"bench", "bench-secret-0123456789"}};
  sc.at_rest.key_file = o.at_rest_key_file;
  if (o.cache_mb >= 0) sc.cache_bytes = uint64_t(o.cache_mb) << 20;
  auto server = storage::Server::start(sc);
  if (!server.ok()) return fmt::print(stderr, "kvstream-bench storage: {}\n", server.status().to_string()), 1;
  storage::ClientConfig cc;
  cc.address = (*server)->address();
  cc.backend.name = o.backend;
  cc.name_space = "bench";
  cc.secret = "bench-secret-0123456789";
  redis::RedisConfig rc;
  rc.cluster = !o.redis_cluster.empty();
  rc.address = rc.cluster ? o.redis_cluster : o.redis;
  rc.name_space = "bench";
  rc.tls.enabled = !o.redis_tls_ca.empty();
  rc.tls.ca_file = o.redis_tls_ca, rc.tls.cert_file = o.redis_tls_cert, rc.tls.key_file = o.redis_tls_key;
  rc.at_rest.key_file = o.redis_at_rest_key_file;
  const bool use_redis = !rc.address.empty();
  auto connect = [&]() -> Result<std::unique_ptr<storage::Client>> {
    return use_redis ? redis::connect(rc, deadline_in(10s)) : storage::Client::connect(cc, deadline_in(10s));
  };
  std::string target = !use_redis ? o.backend : (rc.cluster ? "redis-cluster " : "redis ") + rc.address;
  if (use_redis && rc.tls.enabled) target += ", tls";
  if (use_redis && !rc.at_rest.key_file.empty()) target += ", sealed at rest";
  if (!use_redis) {
    if (!o.at_rest_key_file.empty()) target += ", encrypted at rest";
    if (o.cache_mb >= 0) target += fmt::format(", cache {} MiB", o.cache_mb);
  }
  double put_s = 0;
  {
    auto loader = connect();
    if (!loader.ok()) return fmt::print(stderr, "kvstream-bench storage: {}\n", loader.status().to_string()), 1;
    std::vector<std::byte> chunk(o.chunk_bytes);
    const auto t0 = Clock::now();
    for (uint32_t pass = 0; pass < std::max(o.put_passes, 1u); ++pass)
      for (uint32_t i = 0; i < o.chunks; ++i) {
        std::fill(chunk.begin(), chunk.end(), std::byte(i));
        if (Status s = (*loader)->put("load", i, 0, chunk, deadline_in(30s)); !s.ok())
          return fmt::print(stderr, "kvstream-bench storage: put: {}\n", s.to_string()), 1;
      }
    // One client putting one chunk at a time: a put's whole path (fill included).
    put_s = since(t0);
  }
  std::atomic<uint64_t> ok{0}, errors{0}, wrong{0};
  std::vector<std::vector<double>> lat(o.clients);
  std::vector<std::thread> threads;
  const auto end = Clock::now() + std::chrono::duration<double>(o.seconds);
  for (uint32_t t = 0; t < o.clients; ++t)
    threads.emplace_back([&, t] {
      auto c = connect();
      if (!c.ok()) {
        ++errors;
        return;
      }
      std::vector<std::byte> buf(o.chunk_bytes);
      auto mr = (*c)->register_memory(buf.data(), buf.size());
      std::mt19937 rng(t);
      while (Clock::now() < end) {
        const uint32_t i = rng() % o.chunks;
        const auto t0 = Clock::now();
        auto r = (*c)->get("load", i, 0, *mr, 0, buf.size(), deadline_in(5s));
        lat[t].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        if (!r.ok()) {
          if (errors++ < 5) fmt::print(stderr, "fetch of chunk {}: {}\n", i, r.status().to_string());
          continue;
        }
        // Every delivered chunk is the right one, whole.
        if (*r != o.chunk_bytes || buf.front() != std::byte(i) || buf.back() != std::byte(i)) ++wrong;
        ++ok;
      }
    });
  // Memory after a tenth of the run (every client connected, buffers and cache warm)
  // and at the end: a leak or unbounded queue shows as growth between them.
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds / 10));
  const uint64_t rss_warm = rss_bytes();
  for (auto& t : threads) t.join();
  const uint64_t rss_end = rss_bytes();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all.empty() ? 0.0 : all[std::min(all.size() - 1, size_t(p * double(all.size())))]; };
  const auto counters = (*server)->counters();
  (*server)->stop();
  fs::remove_all(dir);
  const double gbps = double(ok.load()) * double(o.chunk_bytes) * 8 / o.seconds / 1e9;
  fmt::print("backend {}: {} clients x {:.0f} s, chunks of {} bytes: {} fetches, {} errors, {} wrong; {:.2f} Gbit/s\n",
             target, o.clients, o.seconds, o.chunk_bytes, ok.load(), errors.load(), wrong.load(), gbps);
  fmt::print("chunk latency us: p50 {:.0f}  p99 {:.0f}  p999 {:.0f}  max {:.0f}; server cache hits {}\n", pct(0.5),
             pct(0.99), pct(0.999), all.empty() ? 0.0 : all.back(), counters.cache_hits);
  fmt::print("resident memory: {:.1f} MiB after {:.0f} s, {:.1f} MiB at the end\n", double(rss_warm) / 1048576,
             o.seconds / 10, double(rss_end) / 1048576);
  const uint32_t puts = std::max(o.put_passes, 1u) * o.chunks;
  const double put_gbps = double(puts) * double(o.chunk_bytes) * 8 / put_s / 1e9;
  fmt::print("puts before the fetches: {} by one client in {:.2f} s, {:.2f} Gbit/s\n", puts, put_s, put_gbps);
  if (!o.json.empty()) {
    nlohmann::json j = {{"backend", target}, {"clients", o.clients}, {"seconds", o.seconds},
                        {"chunk_bytes", o.chunk_bytes}, {"fetches", ok.load()}, {"errors", errors.load()},
                        {"wrong", wrong.load()}, {"lat_us_p50", pct(0.5)}, {"lat_us_p99", pct(0.99)},
                        {"lat_us_p999", pct(0.999)}, {"gbit_per_s", gbps}, {"rss_warm_bytes", rss_warm},
                        {"rss_end_bytes", rss_end}, {"put_gbit_per_s", put_gbps},
                        {"at_rest", !o.at_rest_key_file.empty()},
                        {"cache_mb", o.cache_mb}};
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  return errors.load() == 0 && wrong.load() == 0 ? 0 : 1;
}

}  // namespace kvstream::bench
