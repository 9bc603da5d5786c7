// kvstream-bench removes: what a remembered remove costs a storage node. A node in
// this process over tcp; each round puts `contexts` contexts of one chunk and removes
// them one after another from one client, timing each remove. Rounds alternate
// between a node that remembers no removes (the anchor: ServerConfig::remove_memory
// 0, the node before 2026-12-06's tombstones) and one that remembers them (the
// default: each remove synced to the store's .removes file before it is answered).
// Each round then puts every context again at a version the removes covered, as a
// node that was away would hand its copies over: the anchor takes them back, the
// default refuses them. Last, the hand-on a rebalance gives a node that joins: the
// removes a node remembers, of contexts the receiving node does not hold, sent one
// request each (remove_up_to, the anchor) and as batches (remove_many).
#include <fstream>

#include <nlohmann/json.hpp>

#include "perf/bench.hpp"
#include "storage/protocol.hpp"

namespace kvstream::bench {

namespace {

using namespace std::chrono_literals;
using transport::Clock;
using transport::deadline_in;

struct Round {
  std::vector<double> remove_us;
  uint64_t copies_back = 0;  // older copies a node took after the removes
};

// A node on `dir` (emptied first) remembering removes for `memory` (0: none), at
// most `most`, and a client of it.
struct Node {
  std::unique_ptr<storage::Server> server;
  std::unique_ptr<storage::Client> client;
};
Result<Node> start_node(const std::filesystem::path& dir, std::chrono::seconds memory, uint64_t most) {
  const std::string secret = "removes-bench-secret-0123456789";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = dir.string();
  sc.secrets = {{"bench", secret}};
  sc.remove_memory = memory, sc.max_removes_remembered = most;
  Node n;
  KVS_ASSIGN_OR_RETURN(n.server, storage::Server::start(sc));
  storage::ClientConfig cc;
  cc.address = n.server->address(), cc.name_space = "bench", cc.secret = secret;
  KVS_ASSIGN_OR_RETURN(n.client, storage::Client::connect(cc, deadline_in(10s)));
  return n;
}

Result<Round> run_round(const RemovesBenchOptions& o, const std::filesystem::path& dir, bool remember) {
  const storage::ServerConfig defaults;
  KVS_ASSIGN_OR_RETURN(Node node, start_node(dir, remember ? defaults.remove_memory : std::chrono::seconds(0),
                                             defaults.max_removes_remembered));
  auto& client = node.client;
  const std::vector<std::byte> chunk(size_t(o.chunk_kb) << 10, std::byte{3});
  const uint64_t version = storage::next_write_version();
  for (uint32_t i = 0; i < o.contexts; ++i)
    KVS_RETURN_IF_ERROR(client->put_versioned(fmt::format("ctx-{}", i), 0, 0, chunk, version, deadline_in(10s)));
  Round r;
  for (uint32_t i = 0; i < o.contexts; ++i) {
    const auto t0 = Clock::now();
    KVS_RETURN_IF_ERROR(client->remove(fmt::format("ctx-{}", i), deadline_in(10s)));
    r.remove_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  for (uint32_t i = 0; i < o.contexts; ++i) {
    const Status s = client->put_versioned(fmt::format("ctx-{}", i), 0, 0, chunk, version, deadline_in(10s));
    if (s.ok()) ++r.copies_back;
    else if (s.code() != StatusCode::already_exists) return s;
  }
  return r;
}

// Seconds to hand `n` removes of contexts the node does not hold to a remembering
// node: one request each, then (other contexts) in batches.
Result<std::pair<double, double>> hand_on(const RemovesBenchOptions& o, const std::filesystem::path& dir) {
  KVS_ASSIGN_OR_RETURN(Node node, start_node(dir, storage::ServerConfig().remove_memory, 4 * uint64_t(o.hand_on)));
  auto& [server, client] = node;
  const uint64_t version = storage::next_write_version();
  auto t0 = Clock::now();
  for (uint32_t i = 0; i < o.hand_on; ++i)
    if (Status s = client->remove_up_to(fmt::format("one-{}", i), version, deadline_in(10s));
        !s.ok() && s.code() != StatusCode::not_found)
      return s;
  const double single = since(t0);
  std::vector<storage::ContextRemove> batch;
  for (uint32_t i = 0; i < o.hand_on; ++i) batch.push_back({fmt::format("many-{}", i), version});
  t0 = Clock::now();
  KVS_RETURN_IF_ERROR(client->remove_many(batch, deadline_in(60s)));
  const double many = since(t0);
  if (server->counters().removes_remembered != 2 * uint64_t(o.hand_on))
    return make_status(StatusCode::internal, "{} removes remembered, not {}", server->counters().removes_remembered,
                       2 * uint64_t(o.hand_on));
  return std::pair{single, many};
}

}  // namespace

int run_removes_bench(const RemovesBenchOptions& o) {
  const Fail fail{"removes"};
  const ScratchDir scratch("kvstream-removes");
  const std::filesystem::path base = o.dir.empty() ? scratch.path : std::filesystem::path(o.dir);
  Round anchor, remembered;
  for (uint32_t round = 0; round < o.rounds; ++round)
    for (bool remember : {false, true}) {
      auto r = run_round(o, base / fmt::format("store-{}-{}", round, remember), remember);
      if (!r.ok()) return fail(r.status());
      Round& into = remember ? remembered : anchor;
      into.remove_us.insert(into.remove_us.end(), r->remove_us.begin(), r->remove_us.end());
      into.copies_back += r->copies_back;
      std::error_code ec;
      std::filesystem::remove_all(base / fmt::format("store-{}-{}", round, remember), ec);
    }
  auto handed = hand_on(o, base / "hand-on");
  if (!handed.ok()) return fail(handed.status());
  const uint64_t n = uint64_t(o.rounds) * o.contexts;
  const double a50 = nearest_rank(anchor.remove_us, 0.5), r50 = nearest_rank(remembered.remove_us, 0.5);
  const double a99 = nearest_rank(anchor.remove_us, 0.99), r99 = nearest_rank(remembered.remove_us, 0.99);
  fmt::print("removes: {} rounds of {} contexts ({} KiB each), one client, tcp loopback, store under {}\n", o.rounds,
             o.contexts, o.chunk_kb, base.string());
  fmt::print("| node | remove, median | p99 | older copies taken back after the removes |\n|---|---|---|---|\n");
  fmt::print("| remembers none (anchor) | {:.0f} us | {:.0f} us | {} of {} |\n", a50, a99, anchor.copies_back, n);
  fmt::print("| remembers them (default) | {:.0f} us ({:.2f}x) | {:.0f} us ({:.2f}x) | {} of {} |\n", r50, r50 / a50,
             r99, r99 / a99, remembered.copies_back, n);
  fmt::print("hand-on of {} removes of contexts a node does not hold: one request each {:.3f} s ({:.0f} us each), in "
             "batches {:.3f} s ({:.1f} us each): {:.1f}x faster\n",
             o.hand_on, handed->first, 1e6 * handed->first / o.hand_on, handed->second,
             1e6 * handed->second / o.hand_on, handed->first / handed->second);
  if (!o.json.empty()) {
    nlohmann::json j;
    j["anchor"] = {{"remove_us_median", a50}, {"remove_us_p99", a99}, {"copies_back", anchor.copies_back}};
    j["remembered"] = {{"remove_us_median", r50}, {"remove_us_p99", r99}, {"copies_back", remembered.copies_back}};
    j["removes"] = n;
    j["hand_on"] = {{"removes", o.hand_on}, {"single_s", handed->first}, {"batched_s", handed->second}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace kvstream::bench
