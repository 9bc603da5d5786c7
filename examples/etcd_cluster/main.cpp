// A client of an etcd-managed storage cluster (run.sh drives it: etcd, nodes joining,
// a node killed). It finds the nodes through etcd, never through a list:
//
//   kvstream-etcd-example put    --etcd URL --chunks N   writes N chunks (R = 2)
//   kvstream-etcd-example wait   --etcd URL --members M  waits for M nodes, each done
//                                                        rebalancing; prints the reports
//   kvstream-etcd-example verify --etcd URL --chunks N   reads every chunk back, checks it
#include <chrono>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvstream/cluster.hpp"
#include "kvstream/membership.hpp"

using namespace kvstream;
using namespace std::chrono_literals;

namespace {

// Chunk c's bytes: recognizable, so verify can tell a wrong chunk from a right one.
std::vector<std::byte> chunk_bytes(uint32_t c, size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((c * 131 + i * 7) & 0xff);
  return v;
}

int wait_for(const cluster::EtcdConfig& etcd, size_t members, std::chrono::seconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < timeout) {
    auto now = cluster::current_members(etcd, transport::deadline_in(2s));
    auto reports = cluster::migration_reports(etcd, transport::deadline_in(2s));
    const bool settled = now.ok() && reports.ok() && now->size() == members && reports->size() == members &&
                         std::all_of(reports->begin(), reports->end(), [&](const cluster::MigrationReport& r) {
                           return r.done && r.members == *now;
                         });
    if (settled) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fmt::print("{} members, every rebalance done ({:.2f} s after asking):\n", members, waited);
      for (const auto& r : *reports)
        fmt::print("  {}: copied {} objects ({} bytes), {} already there, {} failed, {:.2f} s after the change\n",
                   r.node, r.objects_copied, r.bytes_copied, r.objects_present, r.objects_failed, r.seconds);
      return 0;
    }
    std::this_thread::sleep_for(100ms);
  }
  fmt::print(stderr, "kvstream-etcd-example: {} members did not settle within {} s\n", members, timeout.count());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvstream client of a cluster whose membership is in etcd"};
  app.require_subcommand(1);
  cluster::ClusterConfig cfg;
  cfg.name_space = "tenant-a";
  cfg.secret = "0123456789abcdef-example";
  uint32_t chunks = 200, members = 3;
  size_t bytes = 32 * 1024;
  for (auto* sub : {app.add_subcommand("put", "write the chunks"), app.add_subcommand("verify", "read them back"),
                    app.add_subcommand("wait", "wait for the members to settle")}) {
    sub->add_option("--etcd", cfg.etcd.endpoints, "etcd client URL")->required();
    sub->add_option("--prefix", cfg.etcd.prefix, "the cluster's key prefix")->capture_default_str();
    sub->add_option("--chunks", chunks, "chunks")->capture_default_str();
    sub->add_option("--bytes", bytes, "bytes per chunk")->capture_default_str();
    sub->add_option("--members", members, "wait: members to wait for")->capture_default_str();
  }
  CLI11_PARSE(app, argc, argv);
  const std::string cmd = app.get_subcommands().front()->get_name();
  if (cmd == "wait") return wait_for(cfg.etcd, members, 60s);

  auto client = cluster::connect(cfg, transport::deadline_in(10s));
  if (!client.ok()) return fmt::print(stderr, "kvstream-etcd-example: {}\n", client.status().to_string()), 1;
  if (cmd == "put") {
    for (uint32_t c = 0; c < chunks; ++c)
      if (Status s = (*client)->put("ctx", c, 0, chunk_bytes(c, bytes), transport::deadline_in(10s)); !s.ok())
        return fmt::print(stderr, "kvstream-etcd-example: put of chunk {}: {}\n", c, s.to_string()), 1;
    fmt::print("put {} chunks of {} bytes\n", chunks, bytes);
    return 0;
  }
  std::vector<std::byte> buf(bytes);
  auto region = (*client)->register_memory(buf.data(), buf.size());
  if (!region.ok()) return fmt::print(stderr, "kvstream-etcd-example: {}\n", region.status().to_string()), 1;
  uint32_t good = 0;
  for (uint32_t c = 0; c < chunks; ++c) {
    auto r = (*client)->get("ctx", c, 0, *region, 0, buf.size(), transport::deadline_in(10s));
    good += r.ok() && *r == bytes && buf == chunk_bytes(c, bytes);
  }
  fmt::print("{} of {} chunks read back equal\n", good, chunks);
  return good == chunks ? 0 : 1;
}
