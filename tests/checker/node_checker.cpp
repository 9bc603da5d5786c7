// kvstream-node-checker: N clients issue random put/get/remove on a small key set
// against a real kvstream-server process, which is killed (-9) and restarted at
// random points; then the whole history is checked (tests/checker/history.hpp).
// Seeded: the same seed gives the same operations, sizes and crash points (counted
// in completed operations); the interleaving is the machine's.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvstream/log.hpp"
#include "kvstream/storage.hpp"
#include "tests/checker/history.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/temp_dir.hpp"

using namespace kvstream;
using namespace kvstream::checker;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kSecret = "checker-secret-0123456789";

std::atomic<uint64_t> g_ticket{1};
uint64_t ticket() { return g_ticket.fetch_add(1); }

// The value of put `id`: u64 id, u64 size, then bytes that follow from the id, so a
// reader can tell whether what it got is one put's whole value.
uint8_t value_byte(uint64_t id, uint64_t i) {
  uint64_t z = id * 0x9e3779b97f4a7c15ull + (i / 8) * 0xbf58476d1ce4e5b9ull;
  z ^= z >> 31;
  z *= 0x94d049bb133111ebull;
  return uint8_t(z >> ((i % 8) * 8));
}
std::vector<std::byte> make_value(uint64_t id, size_t size) {
  std::vector<std::byte> v(std::max<size_t>(size, 16));
  std::memcpy(v.data(), &id, 8);
  const uint64_t n = v.size();
  std::memcpy(v.data() + 8, &n, 8);
  for (size_t i = 16; i < v.size(); ++i) v[i] = std::byte(value_byte(id, i));
  return v;
}
// The put id of a whole value, or nullopt when the bytes are not one.
std::optional<uint64_t> parse_value(std::span<const std::byte> b) {
  if (b.size() < 16) return std::nullopt;
  uint64_t id = 0, n = 0;
  std::memcpy(&id, b.data(), 8), std::memcpy(&n, b.data() + 8, 8);
  if (n != b.size() || id == 0) return std::nullopt;
  for (size_t i = 16; i < b.size(); ++i)
    if (b[i] != std::byte(value_byte(id, i))) return std::nullopt;
  return id;
}

// The node under test: restarted on the same port and directory after each crash.
class Node {
 public:
  Node(std::string bin, std::string dir, std::string secrets, uint16_t port, std::string backend)
      : bin_(std::move(bin)), dir_(std::move(dir)), secrets_(std::move(secrets)), backend_(std::move(backend)),
        port_(port) {}
  // Starts the node, retried for up to 10 s (a port can linger briefly after a kill).
  bool start_retrying(std::atomic<uint64_t>& retries) {
    const std::vector<std::string> args{"--listen",   address(), "--dir", dir_, "--secrets", secrets_,
                                        "--cache-mb", "4",       "--backend", backend_};
    for (int i = 0; i < 100; ++i) {
      if (proc_.start(bin_, args, "error")) return true;
      ++retries;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  void kill() { proc_.kill(); }
  [[nodiscard]] std::string address() const { return fmt::format("127.0.0.1:{}", port_); }

 private:
  std::string bin_, dir_, secrets_, backend_;
  uint16_t port_;
  kvstream::testing::NodeProcess proc_;
};

uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET, a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

Outcome outcome_of(const Status& s) {
  if (s.ok()) return Outcome::ok;
  switch (s.code()) {
    case StatusCode::unavailable:
    case StatusCode::timed_out:
    case StatusCode::cancelled:
      return Outcome::unknown;  // the connection broke: it may have taken effect
    default:
      return Outcome::failed;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvstream storage node checker: random operations, kill -9 and restart, history check"};
  std::string server_bin, work_dir, backend = "tcp";
  uint64_t seed = 1, ops = 20000, crashes = 10;
  uint32_t clients = 4, contexts = 3, chunks = 2, levels = 2, connections = 1, op_deadline_ms = 20000;
  size_t max_bytes = 3 << 20;
  std::vector<std::string> transport_settings;
  app.add_option("--server", server_bin, "path of kvstream-server")->required();
  app.add_option("--seed", seed, "seed of operations, sizes and crash points")->capture_default_str();
  app.add_option("--ops", ops, "operations in all")->capture_default_str();
  app.add_option("--crashes", crashes, "kill -9 and restart cycles")->capture_default_str();
  app.add_option("--clients", clients, "concurrent clients")->capture_default_str()->check(CLI::Range(1u, 64u));
  app.add_option("--contexts", contexts, "contexts")->capture_default_str()->check(CLI::Range(1u, 100u));
  app.add_option("--chunks", chunks, "chunks per context")->capture_default_str()->check(CLI::Range(1u, 100u));
  app.add_option("--levels", levels, "levels per chunk")->capture_default_str()->check(CLI::Range(1u, 32u));
  app.add_option("--max-bytes", max_bytes, "largest value (spans several protocol segments)")->capture_default_str();
  app.add_option("--dir", work_dir, "work directory (default: a new one under /tmp, removed after)");
  app.add_option("--backend", backend, "transport between the clients and the node: tcp, ucx or libfabric")
      ->capture_default_str();
  app.add_option("--op-deadline-ms", op_deadline_ms, "each operation's deadline")
      ->capture_default_str()
      ->check(CLI::Range(100u, 600000u));
  app.add_option("--connections", connections, "connections of each client")
      ->capture_default_str()
      ->check(CLI::Range(1u, 16u));
  app.add_option("--transport", transport_settings,
                 "a client backend setting, name=value (repeatable; e.g. libfabric.peer_timeout_ms=0)");
  CLI11_PARSE(app, argc, argv);
  transport::BackendConfig client_backend;
  client_backend.name = backend;
  for (const auto& t : transport_settings)
    if (Status s = client_backend.set(t); !s.ok())
      return fmt::print(stderr, "--transport {}: {}\n", t, s.to_string()), 2;
  set_log_level(LogLevel::off);  // broken connections are the point here
  const auto op_deadline = std::chrono::milliseconds(op_deadline_ms);

  std::optional<kvstream::testing::TempDir> own_dir;  // outlives the node
  if (work_dir.empty()) {
    own_dir.emplace("kvstream-checker");
    work_dir = own_dir->string();
  } else {
    fs::remove_all(work_dir);
  }
  fs::create_directories(work_dir + "/store");
  const std::string secrets = work_dir + "/secrets.json";
  std::ofstream(secrets) << fmt::format("{{\"checker\": \"{}\"}}", kSecret);
  Node node(server_bin, work_dir + "/store", secrets, free_port(), backend);
  std::atomic<uint64_t> start_retries{0};
  if (!node.start_retrying(start_retries)) return fmt::print(stderr, "cannot start {}\n", server_bin), 2;

  const uint32_t keys = contexts * chunks * levels;
  std::mutex hist_mu;
  std::vector<Operation> history;
  history.reserve(ops + 16);
  std::atomic<uint64_t> issued{0}, completed{0}, next_put_id{1};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> crash_count{0}, reconnects{0};

  auto connect = [&](std::unique_ptr<storage::Client>& c) {
    storage::ClientConfig cc;
    cc.address = node.address(), cc.name_space = "checker", cc.secret = kSecret;
    cc.backend = client_backend;
    cc.connections = connections;
    for (int i = 0; i < 3000 && !done; ++i) {  // the node may be restarting
      auto r = storage::Client::connect(cc, transport::deadline_in(2s));
      if (r.ok()) return c = std::move(r).value(), true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  };

  std::vector<std::thread> workers;
  for (uint32_t w = 0; w < clients; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(seed * 1000003 + w);
      std::unique_ptr<storage::Client> c;
      std::vector<std::byte> buf(std::max<size_t>(max_bytes, 16) + 64);
      transport::MemoryRegion mr;
      while (issued.fetch_add(1) < ops) {
        if (!c) {
          if (!connect(c)) break;
          mr = *c->register_memory(buf.data(), buf.size());
          ++reconnects;
        }
        Operation o;
        o.key = uint32_t(rng() % keys);
        o.context = o.key / (chunks * levels);
        const uint32_t chunk = (o.key / levels) % chunks, level = o.key % levels;
        const std::string ctx = fmt::format("ctx{}", o.context);
        const uint64_t dice = rng() % 100;
        Status st;
        if (dice < 45) {
          o.kind = Kind::put;
          o.put_id = next_put_id.fetch_add(1);
          // Mostly small values, some spanning several segments.
          const size_t size = (rng() % 8 == 0) ? rng() % (max_bytes + 1) : rng() % 20000;
          const auto v = make_value(o.put_id, size);
          o.invoked = ticket();
          st = c->put(ctx, chunk, level, v, transport::deadline_in(op_deadline));
          o.returned = ticket();
        } else if (dice < 92) {
          o.kind = Kind::get;
          o.invoked = ticket();
          auto r = c->get(ctx, chunk, level, mr, 0, buf.size(), transport::deadline_in(op_deadline));
          o.returned = ticket();
          if (r.ok()) {
            auto id = parse_value(std::span(buf).first(*r));
            o.torn = !id;
            o.put_id = id.value_or(0);
          } else if (r.status().code() == StatusCode::not_found) {
            o.put_id = 0;
          } else if (r.status().code() == StatusCode::corrupt_data) {
            o.corrupt = true;
          } else {
            st = r.status();
          }
        } else {
          o.kind = Kind::remove;
          o.invoked = ticket();
          st = c->remove(ctx, transport::deadline_in(op_deadline));
          o.returned = ticket();
          if (st.code() == StatusCode::not_found) st = {};  // removing nothing is a remove
        }
        o.outcome = outcome_of(st);
        if (o.kind == Kind::get && o.outcome != Outcome::ok) o.outcome = Outcome::unknown;  // an unread read
        if (o.outcome == Outcome::unknown) c.reset();  // its connection is gone
        std::lock_guard lock(hist_mu);
        history.push_back(o);
        ++completed;
      }
    });
  }
  // Crash points: after a seeded number of completed operations each.
  std::thread chaos([&] {
    std::mt19937_64 rng(seed ^ 0x5eed);
    const uint64_t every = std::max<uint64_t>(1, ops / (crashes + 1));
    for (uint64_t k = 0; k < crashes && !done; ++k) {
      const uint64_t at = (k + 1) * every + rng() % std::max<uint64_t>(1, every / 2) - every / 4;
      while (completed < at && !done) std::this_thread::sleep_for(1ms);
      if (done) break;
      node.kill();
      ++crash_count;
      // Restarted at once on the same port and directory.
      if (!node.start_retrying(start_retries)) {
        fmt::print(stderr, "the node did not come back after crash {}\n", k + 1);
        break;
      }
    }
  });
  for (auto& t : workers) t.join();
  done = true;
  chaos.join();
  node.kill();

  const auto anomalies = check(history);
  uint64_t counts[3] = {}, unknown = 0, failed = 0;
  for (const auto& o : history) {
    ++counts[int(o.kind)];
    unknown += o.outcome == Outcome::unknown;
    failed += o.outcome == Outcome::failed;
  }
  fmt::print("seed {}: {} operations ({} puts, {} gets, {} removes; {} in flight at a crash or refused by a dying "
             "node, {} refused), {} kill -9 + restart cycles ({} restarts retried), {} connects; {} anomalies\n",
             seed, history.size(), counts[0], counts[1], counts[2], unknown, failed, crash_count.load(),
             start_retries.load(), reconnects.load(), anomalies.size());
  for (size_t i = 0; i < std::min<size_t>(anomalies.size(), 20); ++i) {
    const auto& o = history[anomalies[i].op];
    fmt::print("  anomaly: op {} (get key {}, tickets {}..{}, read put {}): {}\n", anomalies[i].op, o.key, o.invoked,
               o.returned, o.put_id, anomalies[i].what);
  }
  if (history.size() < ops / 2) return fmt::print(stderr, "too few operations completed\n"), 1;
  if (crash_count < crashes) return fmt::print(stderr, "only {} of {} crashes happened\n", crash_count.load(), crashes), 1;
  return anomalies.empty() ? 0 : 1;
}
