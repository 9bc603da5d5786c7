// kvstream-stray-bench: a storage node while a peer floods its endpoint with tagged
// messages no receive will take (transport/ucx/ucx_strays.hpp and
// transport/ofi/ofi_strays.hpp sweep them). The node runs as its own process (kvstream-server --backend
// ucx --ucx-tls tcp, or --backend libfabric over tcp;ofi_rxm, default settings), so
// its resident size is read from /proc; --server-bin runs the same phases against
// another build of the node (one from before the sweep is the anchor).
//   unloaded   a victim tenant fetches 1 MiB objects alone: the latency anchor;
//   strays     the same while a peer that connected (a handshake, no login) sends
//              4 KiB messages under connection ids none uses, 64 in flight, as fast as
//              it can;
//   after      the victim alone again, the flood over (what the node still holds).
// Per phase: strays sent, the node's peak and last RSS, the victim's fetches that
// succeeded and their p50/p99 latency.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "kvstream/log.hpp"
#include "kvstream/storage.hpp"
#include "perf/node_sampler.hpp"
#include "tests/support/node_process.hpp"
#include "tests/transport/ofi_raw_peer.hpp"
#include "tests/transport/ucx_raw_client.hpp"

using namespace kvstream;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace ux = kvstream::transport::ucx_detail;

namespace {

const std::string kVictimSecret = "victim-secret-0123456789";

struct PhaseResult {
  std::string phase;
  uint64_t strays = 0, fetches = 0, fetch_ok = 0, peak_rss = 0, last_rss = 0;
  double p50_ms = 0, p99_ms = 0;
};

/// Sends, from a peer of the node's UCX worker built from the engine up (a real
/// handshake), 4 KiB messages under random rx ids other than its own connection's, 64
/// in flight, until `stop`; returns how many went out.
uint64_t flood_ucx(test_ucx::RawClient& raw, const std::atomic<bool>& stop) {
  const std::vector<std::byte> body(4096, std::byte{0x42});
  std::vector<ux::Op> ops(64);
  std::mt19937 rng(1);
  uint64_t sent = 0;
  while (!stop) {
    for (auto& op : ops) {
      std::lock_guard lk(raw.eng->mu);
      if (!op.done) continue;
      op.release();
      uint32_t rx;
      do rx = rng() & ux::kRxIdMask;
      while (rx == 0 || rx == raw.cs->peer_rx_id);
      op.arm();
      ucp_request_param_t p = ux::send_param(op);
      const uint64_t tag = ux::make_tag(rx, ux::kHeaderKind, 0);
      if (!op.track(ucp_tag_send_nbx(raw.cs->ep, body.data(), body.size(), tag, &p))) return sent;
      ++sent;
    }
    std::lock_guard lk(raw.eng->mu);
    raw.eng->progress_locked();
  }
  (void)raw.eng->wait_quiet(
      [&] { return std::all_of(ops.begin(), ops.end(), [](const ux::Op& o) { return o.done; }); }, 10s);
  std::lock_guard lk(raw.eng->mu);
  for (auto& op : ops) op.release();
  return sent;
}

/// The same over libfabric: a peer that said hello to the node's listener sends
/// header-tagged messages under connection ids other than the one it was given.
uint64_t flood_ofi(transport::test_util::RawOfiPeer& peer, const std::atomic<bool>& stop) {
  namespace of = kvstream::transport::ofi;
  std::vector<std::shared_ptr<of::Op>> ops(64);
  std::mt19937 rng(1);
  uint64_t sent = 0;
  while (!stop) {
    for (auto& op : ops) {
      if (op && !op->done.load()) continue;
      op = peer.ep->new_op(4096);
      std::memset(op->buf.get(), 0x42, 4096);
      auto desc = peer.ep->local_desc(*op);
      if (!desc.ok()) return sent;
      uint32_t conn;
      do conn = rng() & uint32_t(of::Tag::kConnMask);
      while (conn == 0 || conn == peer.greeted.id);
      const ssize_t r = peer.ep->try_send(op, op->buf.get(), 4096, *desc, peer.server,
                                          of::make_tag(of::MsgType::header, conn, 0));
      if (r == -FI_EAGAIN) {
        op.reset();
        break;
      }
      if (r != 0) return sent;
      ++sent;
    }
    std::this_thread::yield();
  }
  for (auto& op : ops)
    if (op) (void)peer.ep->wait([&] { return op->done.load(); }, transport::deadline_in(10s), nullptr, "flood");
  return sent;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a storage node while a peer floods its endpoint with stray messages"};
  std::string server_bin = (fs::read_symlink("/proc/self/exe").parent_path() / "kvstream-server").string();
  std::string json_out, node_log_level = "warn", backend = "ucx";
  double seconds = 8;
  uint32_t objects = 32;
  app.add_option("--server-bin", server_bin, "kvstream-server to run")->capture_default_str();
  app.add_option("--backend", backend, "ucx (over tcp) or libfabric (tcp;ofi_rxm)")
      ->capture_default_str()
      ->check(CLI::IsMember({"ucx", "libfabric"}));
  app.add_option("--seconds", seconds, "length of each phase")->capture_default_str()->check(CLI::Range(1.0, 600.0));
  app.add_option("--objects", objects, "1 MiB objects the victim fetches")->capture_default_str()->check(CLI::Range(1u, 1024u));
  app.add_option("--json", json_out, "also write the table as JSON here");
  app.add_option("--node-log-level", node_log_level, "the node's log level (its log goes to stderr at the end)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  set_log_level(LogLevel::error);

  const fs::path dir = fs::temp_directory_path() / fmt::format("kvstream-strays-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "store");
  std::ofstream(dir / "secrets.json") << fmt::format(R"({{"victim": "{}"}})", kVictimSecret);
  kvstream::testing::NodeProcess node;
  std::vector<std::string> args{"--listen",  "127.0.0.1:0", "--backend", backend, "--dir", (dir / "store").string(),
                                "--secrets", (dir / "secrets.json").string()};
  if (backend == "ucx") args.insert(args.end(), {"--ucx-tls", "tcp"});
  if (!node.start(server_bin, args, node_log_level))
    return fmt::print(stderr, "{} did not start\n", server_bin), 2;
  const std::string addr = node.address();
  const pid_t pid = node.pid();

  storage::ClientConfig vc;
  vc.address = addr, vc.name_space = "victim", vc.secret = kVictimSecret;
  vc.backend.name = backend, vc.backend.ucx.tls = "tcp";
  auto victim = storage::Client::connect(vc, transport::deadline_in(10s));
  if (!victim.ok()) return fmt::print(stderr, "victim: {}\n", victim.status().to_string()), 2;
  std::vector<std::byte> obj(1 << 20, std::byte{0x5a}), buf(1 << 20);
  for (uint32_t i = 0; i < objects; ++i)
    if (!(*victim)->put("ctx", i, 0, obj, transport::deadline_in(20s)).ok()) return 2;
  auto mr = (*victim)->register_memory(buf.data(), buf.size());
  if (!mr.ok()) return fmt::print(stderr, "register: {}\n", mr.status().to_string()), 2;

  auto victim_phase = [&](const std::string& name) {
    PhaseResult r;
    r.phase = name;
    std::vector<double> lat;
    perf::PeakRss sampler(pid);
    const auto end = transport::Clock::now() + std::chrono::duration<double>(seconds);
    for (uint64_t i = 0; transport::Clock::now() < end; ++i) {
      ++r.fetches;
      const auto t0 = transport::Clock::now();
      auto g = (*victim)->get("ctx", uint32_t(i % objects), 0, *mr, 0, buf.size(), transport::deadline_in(5s));
      if (g.ok() && *g == buf.size() && buf[777] == std::byte{0x5a}) {
        ++r.fetch_ok;
        lat.push_back(std::chrono::duration<double, std::milli>(transport::Clock::now() - t0).count());
      }
    }
    r.peak_rss = sampler.stop();
    r.last_rss = perf::rss_bytes(pid);
    r.p50_ms = perf::percentile(lat, 0.5), r.p99_ms = perf::percentile(lat, 0.99);
    return r;
  };

  std::vector<PhaseResult> results;
  results.push_back(victim_phase("unloaded"));
  {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> sent{0};
    std::thread flooder;
    std::optional<test_ucx::RawClient> ucx_peer;
    std::optional<transport::test_util::RawOfiPeer> ofi_peer;
    if (backend == "ucx") {
      transport::BackendConfig pc;
      pc.name = "ucx", pc.ucx.tls = "tcp";
      auto raw = test_ucx::connect_raw(pc, addr);
      if (!raw.ok()) return fmt::print(stderr, "stray peer: {}\n", raw.status().to_string()), 2;
      ucx_peer.emplace(std::move(raw).value());
      flooder = std::thread([&] { sent = flood_ucx(*ucx_peer, stop); });
    } else {
      auto raw = transport::test_util::raw_ofi_peer(vc.backend.libfabric, addr);
      if (!raw.ok()) return fmt::print(stderr, "stray peer: {}\n", raw.status().to_string()), 2;
      ofi_peer.emplace(std::move(raw).value());
      flooder = std::thread([&] { sent = flood_ofi(*ofi_peer, stop); });
    }
    auto r = victim_phase("strays");
    stop = true;
    flooder.join();
    r.strays = sent;
    results.push_back(r);
  }
  results.push_back(victim_phase("after"));
  victim->reset();
  node.kill(SIGTERM);
  fs::remove_all(dir);

  const double anchor = results[0].p99_ms;
  fmt::print("server: {} ({})\n", server_bin, backend);
  fmt::print("| phase | strays sent | strays (MiB) | node peak RSS (MiB) | node RSS at the end (MiB) | fetches ok | "
             "p50 (ms) | p99 (ms) | p99 / unloaded |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : results) {
    const double ratio = anchor > 0 ? r.p99_ms / anchor : 0;
    fmt::print("| {} | {} | {:.0f} | {:.1f} | {:.1f} | {}/{} | {:.2f} | {:.2f} | {:.2f} |\n", r.phase, r.strays,
               double(r.strays) * 4096 / (1 << 20), double(r.peak_rss) / (1 << 20), double(r.last_rss) / (1 << 20),
               r.fetch_ok, r.fetches, r.p50_ms, r.p99_ms, ratio);
    j.push_back({{"phase", r.phase}, {"strays", r.strays}, {"peak_rss_bytes", r.peak_rss},
                 {"last_rss_bytes", r.last_rss}, {"fetches", r.fetches}, {"fetch_ok", r.fetch_ok},
                 {"p50_ms", r.p50_ms}, {"p99_ms", r.p99_ms}, {"p99_vs_unloaded", ratio}});
  }
  if (!json_out.empty()) std::ofstream(json_out) << j.dump(2) << "\n";
  return 0;
}
