// A client of an etcd-managed storage cluster (run.sh drives it: etcd, nodes joining,
// a node killed). It finds the nodes through etcd, never through a list:
//
//   kvstream-etcd-example put    --etcd URL --chunks N   writes N chunks (R = 2)
//                                [--generation G]        (their G-th contents)
//                                [--nodes A,B,C]         as a client whose member set is
//                                                        behind: to these nodes, not etcd's
//   kvstream-etcd-example wait   --etcd URL --members M  waits for M nodes, each done
//                                [--trimmed]             rebalancing (and done dropping the
//                                                        copies it no longer owns); prints
//                                                        the reports
//   kvstream-etcd-example verify --etcd URL --chunks N   reads every chunk back, checks it
//                                [--generation G]        against its G-th contents
//                                [--wait-s S]            reading again until all match, up to S s
//   kvstream-etcd-example held   --etcd URL --chunks N   what each node holds of them, and
//                                                        the whole against R copies
#include <chrono>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvstream/cluster.hpp"
#include "kvstream/membership.hpp"
#include "kvstream/storage.hpp"

using namespace kvstream;
using namespace std::chrono_literals;

namespace {

// Chunk c's bytes in generation g: recognizable, so verify can tell a wrong chunk, or
// an older write of it, from a right one.
std::vector<std::byte> chunk_bytes(uint32_t c, size_t n, uint32_t g) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((c * 131 + i * 7 + g * 53) & 0xff);
  return v;
}

int wait_for(const cluster::EtcdConfig& etcd, size_t members, bool trimmed, std::chrono::seconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < timeout) {
    auto now = cluster::current_members(etcd, transport::deadline_in(2s));
    auto reports = cluster::migration_reports(etcd, transport::deadline_in(2s));
    const bool settled = now.ok() && reports.ok() && now->size() == members && reports->size() == members &&
                         std::all_of(reports->begin(), reports->end(), [&](const cluster::MigrationReport& r) {
                           return r.done && (r.trimmed || !trimmed) && r.members == *now;
                         });
    if (settled) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fmt::print("{} members, every rebalance done ({:.2f} s after asking):\n", members, waited);
      for (const auto& r : *reports) {
        fmt::print("  {}: copied {} objects ({} bytes), {} already there, {} failed, {:.2f} s after the change\n",
                   r.node, r.objects_copied, r.bytes_copied, r.objects_present, r.objects_failed, r.seconds);
        if (r.trimmed)
          fmt::print("  {}: dropped {} copies of chunks it no longer owns ({} bytes; {} sent first to owners "
                     "that lacked them, {} bytes), kept {}\n",
                     r.node, r.objects_trimmed, r.bytes_trimmed, r.objects_handed_over, r.bytes_handed_over,
                     r.objects_kept);
      }
      return 0;
    }
    std::this_thread::sleep_for(100ms);
  }
  fmt::print(stderr, "kvstream-etcd-example: {} members did not settle within {} s\n", members, timeout.count());
  return 1;
}

// Asks each member what it holds of the chunks (a stat straight to the node).
int held(const cluster::ClusterConfig& cfg, uint32_t chunks, size_t bytes) {
  auto members = cluster::current_members(cfg.etcd, transport::deadline_in(5s));
  if (!members.ok()) return fmt::print(stderr, "kvstream-etcd-example: {}\n", members.status().to_string()), 1;
  uint64_t total = 0;
  for (const auto& node : *members) {
    storage::ClientConfig cc;
    cc.address = node, cc.name_space = cfg.name_space, cc.secret = cfg.secret;
    auto c = storage::Client::connect(cc, transport::deadline_in(10s));
    if (!c.ok()) return fmt::print(stderr, "kvstream-etcd-example: {}: {}\n", node, c.status().to_string()), 1;
    auto st = (*c)->stat("ctx", transport::deadline_in(10s));
    uint64_t n = 0, b = 0;
    for (const auto& s : st.ok() ? *st : std::vector<storage::ChunkStat>{})
      if (!s.level_bytes.empty() && s.level_bytes[0] > 0) ++n, b += s.level_bytes[0];
    fmt::print("  {}: {} chunks, {} bytes\n", node, n, b);
    total += b;
  }
  const double r_copies = double(chunks) * double(bytes) * double(cfg.replication);
  fmt::print("held: {} bytes on {} nodes, {:.3f}x R copies of the data\n", total, members->size(),
             double(total) / r_copies);
  return 0;
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
                    app.add_subcommand("wait", "wait for the members to settle"),
                    app.add_subcommand("held", "what each member holds of the chunks")}) {
    sub->add_option("--etcd", cfg.etcd.endpoints, "etcd client URL")->required();
    sub->add_option("--prefix", cfg.etcd.prefix, "the cluster's key prefix")->capture_default_str();
    sub->add_option("--chunks", chunks, "chunks")->capture_default_str();
    sub->add_option("--bytes", bytes, "bytes per chunk")->capture_default_str();
    sub->add_option("--members", members, "wait: members to wait for")->capture_default_str();
  }
  bool trimmed = false;
  app.get_subcommand("wait")->add_flag("--trimmed", trimmed,
                                       "also wait until each member has dropped the copies it no longer owns");
  uint32_t generation = 0;
  for (const char* sub : {"put", "verify"})
    app.get_subcommand(sub)->add_option("--generation", generation, "which contents of the chunks")->capture_default_str();
  std::vector<std::string> behind;
  app.get_subcommand("put")
      ->add_option("--nodes", behind, "write as a client whose member set is behind: to these nodes, not etcd's")
      ->delimiter(',');
  double wait_s = 0;
  app.get_subcommand("verify")->add_option("--wait-s", wait_s, "read again until every chunk matches, up to this long");
  CLI11_PARSE(app, argc, argv);
  const std::string cmd = app.get_subcommands().front()->get_name();
  if (cmd == "wait") return wait_for(cfg.etcd, members, trimmed, 120s);
  if (cmd == "held") return held(cfg, chunks, bytes);

  if (!behind.empty()) cfg.nodes = behind, cfg.etcd = {};
  auto client = cluster::connect(cfg, transport::deadline_in(10s));
  if (!client.ok()) return fmt::print(stderr, "kvstream-etcd-example: {}\n", client.status().to_string()), 1;
  if (cmd == "put") {
    for (uint32_t c = 0; c < chunks; ++c)
      if (Status s = (*client)->put("ctx", c, 0, chunk_bytes(c, bytes, generation), transport::deadline_in(10s));
          !s.ok())
        return fmt::print(stderr, "kvstream-etcd-example: put of chunk {}: {}\n", c, s.to_string()), 1;
    fmt::print("put {} chunks of {} bytes{}\n", chunks, bytes,
               behind.empty() ? "" : fmt::format(" to {} (a member set behind)", fmt::join(behind, ", ")));
    return 0;
  }
  std::vector<std::byte> buf(bytes);
  auto region = (*client)->register_memory(buf.data(), buf.size());
  if (!region.ok()) return fmt::print(stderr, "kvstream-etcd-example: {}\n", region.status().to_string()), 1;
  const auto start = std::chrono::steady_clock::now();
  const auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::optional<uint32_t> at_first;  // the count of the first read, before any wait
  for (;; std::this_thread::sleep_for(50ms)) {
    uint32_t good = 0;
    for (uint32_t c = 0; c < chunks; ++c) {
      auto r = (*client)->get("ctx", c, 0, *region, 0, buf.size(), transport::deadline_in(10s));
      good += r.ok() && *r == bytes && buf == chunk_bytes(c, bytes, generation);
    }
    if (!at_first) at_first = good;
    if (good == chunks || waited() >= wait_s) {
      fmt::print("{} of {} chunks read back equal{}\n", good, chunks,
                 wait_s > 0 ? fmt::format(" after {:.2f} s ({} at the first read)", waited(), *at_first) : "");
      return good == chunks ? 0 : 1;
    }
  }
}
