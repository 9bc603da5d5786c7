// kvstream-attack-bench: a storage node's memory and another tenant's service while
// hostile clients attack it (issue 15's figures). The node runs as its own process
// (kvstream-server, default settings), so its resident size is read from /proc.
//   unloaded     the victim tenant alone: its fetch latency is the anchor;
//   huge-puts    64 connections of an attacker tenant each declare a 1 GiB put, send
//                its first 1 MiB segment whole and trickle the second, 1 KiB every
//                100 ms;
//   preauth      255 sockets from 255 loopback source addresses connect and never
//                log in (reconnecting 100 ms after the node drops one);
//   junk         8 threads connect again and again and answer the node's hello with
//                bytes that are not a frame.
// The victim fetches 1 MiB objects over one connection and logs in anew every 20
// fetches; per phase: fetches and logins that succeeded, p50/p99 fetch latency, the
// node's peak RSS against its memory budget, and the lines the node logged (what a
// hostile peer causes at will reaches its log only through rate-limited counts).
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "kvstream/log.hpp"
#include "kvstream/storage.hpp"
#include "perf/node_sampler.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/raw_peer.hpp"

using namespace kvstream;
using namespace std::chrono_literals;
using kvstream::testing::RawPeer;
namespace fs = std::filesystem;

namespace {

const std::string kVictimSecret = "victim-secret-0123456789", kAttackerSecret = "attacker-secret-012345678";

struct PhaseResult {
  std::string phase;
  uint64_t fetches = 0, fetch_ok = 0, logins = 0, login_ok = 0, peak_rss = 0;
  uint64_t node_log_lines = 0, attacks = 0;  // lines the node logged; attacking connections made
  double p50_ms = 0, p99_ms = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"storage node memory and a tenant's service under attack"};
  std::string server_bin = (fs::read_symlink("/proc/self/exe").parent_path() / "kvstream-server").string();
  std::string json_out;
  double seconds = 8;
  uint32_t objects = 32, attackers = 64, preauth = 255;
  app.add_option("--server-bin", server_bin, "kvstream-server to attack")->capture_default_str();
  app.add_option("--seconds", seconds, "length of each phase")->capture_default_str()->check(CLI::Range(1.0, 600.0));
  app.add_option("--objects", objects, "1 MiB objects the victim fetches")->capture_default_str()->check(CLI::Range(1u, 1024u));
  app.add_option("--attackers", attackers, "huge-put connections")->capture_default_str()->check(CLI::Range(1u, 64u));
  app.add_option("--preauth", preauth, "unauthenticated sockets")->capture_default_str()->check(CLI::Range(1u, 1000u));
  app.add_option("--json", json_out, "also write the table as JSON here");
  CLI11_PARSE(app, argc, argv);
  set_log_level(LogLevel::error);

  const fs::path dir = fs::temp_directory_path() / fmt::format("kvstream-attack-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "store");
  std::ofstream(dir / "secrets.json") << fmt::format(R"({{"victim": "{}", "attacker": "{}"}})", kVictimSecret,
                                                     kAttackerSecret);
  kvstream::testing::NodeProcess node;
  if (!node.start(server_bin,
                  {"--listen", "127.0.0.1:0", "--dir", (dir / "store").string(), "--secrets",
                   (dir / "secrets.json").string()},
                  "warn"))
    return fmt::print(stderr, "{} did not start\n", server_bin), 2;
  const std::string addr = node.address();
  const pid_t pid = node.pid();

  storage::ClientConfig vc;
  vc.address = addr, vc.name_space = "victim", vc.secret = kVictimSecret;
  auto setup = storage::Client::connect(vc, transport::deadline_in(10s));
  if (!setup.ok()) return fmt::print(stderr, "victim: {}\n", setup.status().to_string()), 2;
  std::vector<std::byte> obj(1 << 20, std::byte{0x5a});
  for (uint32_t i = 0; i < objects; ++i)
    if (!(*setup)->put("ctx", i, 0, obj, transport::deadline_in(20s)).ok()) return 2;
  setup->reset();

  auto victim_phase = [&](const std::string& name) {
    PhaseResult r;
    r.phase = name;
    std::vector<double> lat;
    perf::PeakRss sampler(pid);
    std::vector<std::byte> buf(1 << 20);
    const uint64_t lines_before = node.log_lines();
    const auto end = transport::Clock::now() + std::chrono::duration<double>(seconds);
    std::unique_ptr<storage::Client> c;
    transport::MemoryRegion mr;
    for (uint64_t i = 0; transport::Clock::now() < end; ++i) {
      if (i % 20 == 0) {
        c.reset();
        ++r.logins;
        auto cc = storage::Client::connect(vc, transport::deadline_in(5s));
        if (!cc.ok()) continue;
        ++r.login_ok;
        c = std::move(cc).value();
        mr = *c->register_memory(buf.data(), buf.size());
      }
      if (!c) continue;
      ++r.fetches;
      const auto t0 = transport::Clock::now();
      auto g = c->get("ctx", uint32_t(i % objects), 0, mr, 0, buf.size(), transport::deadline_in(5s));
      if (g.ok() && *g == buf.size() && buf[777] == std::byte{0x5a}) {
        ++r.fetch_ok;
        lat.push_back(std::chrono::duration<double, std::milli>(transport::Clock::now() - t0).count());
      }
    }
    r.peak_rss = sampler.stop();
    r.node_log_lines = node.log_lines() - lines_before;
    r.p50_ms = perf::percentile(lat, 0.5), r.p99_ms = perf::percentile(lat, 0.99);
    return r;
  };

  std::vector<PhaseResult> results;
  results.push_back(victim_phase("unloaded"));
  {
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    std::atomic<uint32_t> started{0};
    for (uint32_t a = 0; a < attackers; ++a) {
      ts.emplace_back([&, a] {
        RawPeer p;
        if (!p.connect(addr) || !p.authenticate("attacker", kAttackerSecret)) return;
        storage::Request put;
        put.op = storage::Op::put, put.id = 1, put.context = "huge", put.chunk = a;
        put.total = storage::kMaxChunkBytes;
        // The first segment whole (its buffer is then filled, every page touched), then
        // the second one trickled.
        const std::vector<std::byte> first(storage::kSegmentBytes, std::byte{1}), kib(1024, std::byte{1});
        if (!p.send_message(storage::encode(put), storage::kSegmentBytes, first)) return;
        if (!p.send_message(storage::data_request_header(1, 1), storage::kSegmentBytes, kib)) return;
        ++started;
        while (!stop && p.write_all(kib.data(), kib.size())) std::this_thread::sleep_for(100ms);
      });
    }
    const auto ready_by = transport::Clock::now() + 5s;
    while (started < attackers && transport::Clock::now() < ready_by) std::this_thread::sleep_for(10ms);
    results.push_back(victim_phase("huge-puts"));
    stop = true;
    for (auto& t : ts) t.join();
  }
  {
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    // 255 sockets over 8 threads, each socket from its own source address.
    for (uint32_t t = 0; t < 8; ++t) {
      ts.emplace_back([&, t] {
        std::vector<RawPeer> socks;
        std::vector<std::string> sources;
        for (uint32_t i = t; i < preauth; i += 8) sources.push_back(fmt::format("127.0.{}.{}", 2 + i / 250, 1 + i % 250));
        socks.resize(sources.size());
        for (size_t i = 0; i < socks.size(); ++i) socks[i].connect(addr, sources[i]);
        while (!stop) {
          for (size_t i = 0; i < socks.size() && !stop; ++i) {
            if (socks[i].closed_by_peer(0)) {  // dropped by the node: come back
              socks[i] = RawPeer();
              socks[i].connect(addr, sources[i]);
            }
          }
          std::this_thread::sleep_for(100ms);
        }
      });
    }
    std::this_thread::sleep_for(500ms);
    results.push_back(victim_phase("preauth"));
    stop = true;
    for (auto& t : ts) t.join();
  }
  {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> made{0};
    std::vector<std::thread> ts;
    const std::vector<std::byte> junk(64, std::byte{0x5a});
    for (uint32_t t = 0; t < 8; ++t) {
      ts.emplace_back([&] {
        while (!stop) {
          RawPeer p;
          if (!p.connect(addr) || !p.read_response(5000)) continue;
          if (p.write_all(junk.data(), junk.size())) ++made;
          p.closed_by_peer(5000);
        }
      });
    }
    results.push_back(victim_phase("junk"));
    stop = true;
    for (auto& t : ts) t.join();
    results.back().attacks = made;
  }
  node.kill(SIGTERM);
  fs::remove_all(dir);

  const uint64_t budget = (256ull + 256ull) << 20;  // the node's default: cache 256 MiB + 256 MiB
  const double anchor = results[0].p99_ms;
  fmt::print("| phase | peak RSS (MiB) | budget (MiB) | fetches ok | logins ok | p50 (ms) | p99 (ms) | p99 / unloaded | "
             "node log lines |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json j = nlohmann::json::array();
  bool pass = true;
  for (const auto& r : results) {
    const double ratio = anchor > 0 ? r.p99_ms / anchor : 0;
    const std::string phase = r.attacks ? fmt::format("{} ({} connections)", r.phase, r.attacks) : r.phase;
    fmt::print("| {} | {:.1f} | {} | {}/{} | {}/{} | {:.2f} | {:.2f} | {:.2f} | {} |\n", phase,
               double(r.peak_rss) / (1 << 20), budget >> 20, r.fetch_ok, r.fetches, r.login_ok, r.logins, r.p50_ms,
               r.p99_ms, ratio, r.node_log_lines);
    j.push_back({{"phase", r.phase}, {"peak_rss_bytes", r.peak_rss}, {"budget_bytes", budget},
                 {"fetches", r.fetches}, {"fetch_ok", r.fetch_ok}, {"logins", r.logins}, {"login_ok", r.login_ok},
                 {"p50_ms", r.p50_ms}, {"p99_ms", r.p99_ms}, {"p99_vs_unloaded", ratio},
                 {"node_log_lines", r.node_log_lines}, {"attack_connections", r.attacks}});
    // The node's three rate-limited logs write at most a line and a count per interval
    // (10 s) each; a line per attacking connection would be far past this.
    const uint64_t log_bound = 3 * 2 * (1 + uint64_t(seconds / 10));
    pass = pass && r.peak_rss <= budget && r.fetch_ok == r.fetches && r.login_ok == r.logins && ratio <= 5.0 &&
           r.node_log_lines <= log_bound;
  }
  fmt::print("{}\n", pass ? "within the figures (RSS <= budget, 100% success, p99 <= 5x unloaded, the node's log "
                            "bounded by its rate limits)"
                          : "OUTSIDE the figures");
  if (!json_out.empty()) std::ofstream(json_out) << j.dump(2) << "\n";
  return pass ? 0 : 1;
}
