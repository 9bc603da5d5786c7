// A runtime's own request scheduler on top of kvstream's fetch scheduler.
//
// Requests for long contexts arrive with a time-to-first-token budget and a priority.
// For each one the runtime asks kvstream, before committing, what fetching its KV
// cache would cost (admission): when the prediction misses the budget, or would
// recompute most of the context anyway, the runtime prefills from text instead;
// otherwise it submits the fetch and follows it chunk by chunk. One request is
// cancelled midway (its user went away). Everything runs in this process: a storage
// node on loopback holding three contexts encoded at every level.
//
//   build/bin/kvstream-scheduler-example
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "kvstream/scheduler.hpp"

using namespace kvstream;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const KvGeometry kGeom{4, 2, 32, 8, AttentionKind::gqa};
const RopeParams kRope{true, 10000.0f, 0, RopePairing::interleaved};
constexpr uint32_t kTokens = 2048, kChunkTokens = 256;

// Smooth KV-like rows (per-channel offsets, slow drift, a little noise): stands in
// for a model's cache so the example needs no model files.
KvCache make_kv(uint32_t seed) {
  auto kv = KvCache::create(kGeom, DType::f32, kTokens).value();
  kv.set_rope(kRope);
  std::vector<float> row(kGeom.channels());
  uint32_t x = seed * 2654435761u + 1;
  for (uint32_t l = 0; l < kGeom.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < kTokens; ++t) {
        for (uint32_t c = 0; c < row.size(); ++c) {
          x ^= x << 13, x ^= x >> 17, x ^= x << 5;
          row[c] = 0.5f * float(c % 7) + std::sin(0.01f * float(t) + float(c)) + 0.1f * (float(x % 1000) / 500.0f - 1);
        }
        if (p == 0)
          for (uint32_t h = 0; h < kGeom.kv_heads; ++h)
            rope_rotate(&row[h * kGeom.head_dim], kGeom.head_dim, t, kRope, false);
        kv.view().store_row(l, p, t, row.data());
      }
  return kv;
}

int fail(const Status& s) {
  fmt::print(stderr, "scheduler example: {}\n", s.to_string());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A runtime's own request scheduler on kvstream's fetch scheduler: admission against a TTFT budget, "
               "priorities and a cancel, all in this process (a storage node on loopback); takes no options"};
  CLI11_PARSE(app, argc, argv);
  // --- The storage side: a node with three contexts at every level. -------------
  const fs::path dir = fs::temp_directory_path() / fmt::format("kvstream-scheduler-example-{}", ::getpid());
  struct Cleanup {
    fs::path d;
    ~Cleanup() { fs::remove_all(d); }
  } cleanup{dir};
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = dir.string();
  sc.secrets = {{"tenant", "example-secret-123"}};
  auto server = storage::Server::start(sc);
  if (!server.ok()) return fail(server.status());
  storage::ClientConfig cc;
  cc.address = (*server)->address();
  cc.name_space = "tenant";
  cc.secret = "example-secret-123";
  auto client = storage::Client::connect(cc, transport::deadline_in(10s));
  if (!client.ok()) return fail(client.status());

  const auto ranges = codec::chunk_ranges(kTokens, kChunkTokens);
  KvCache train = make_kv(1);
  std::vector<KvView> samples;
  for (const auto& r : ranges) samples.push_back(*train.view().slice(r));
  codec::ProfileOptions po;
  po.level_steps = {0.05f, 0.15f, 0.4f, 1.0f};
  auto profile = codec::ProfileBuilder::build(samples, kRope, po);
  if (!profile.ok()) return fail(profile.status());
  // Decode cost per level, measured once here (a runtime measures it at start-up).
  std::vector<double> decode_seconds_per_byte;
  {
    KvCache kv = make_kv(2);
    auto out = KvCache::create(kGeom, DType::f16, kChunkTokens).value();
    for (uint32_t L = 0; L < profile->levels(); ++L) {
      std::vector<uint8_t> bytes;
      if (Status s = codec::encode_chunk(*profile, *kv.view().slice(ranges[0]), L, bytes); !s.ok()) return fail(s);
      const auto t0 = transport::Clock::now();
      for (int rep = 0; rep < 5; ++rep)
        if (Status s = codec::decode_chunk(*profile, bytes, out.view()); !s.ok()) return fail(s);
      decode_seconds_per_byte.push_back(
          std::chrono::duration<double>(transport::Clock::now() - t0).count() / 5 / double(bytes.size()));
    }
  }
  for (const char* ctx : {"story-1", "story-2", "story-3"}) {
    KvCache kv = make_kv(uint32_t(ctx[6]));
    for (uint32_t i = 0; i < ranges.size(); ++i)
      for (uint32_t L = 0; L < profile->levels(); ++L) {
        std::vector<uint8_t> bytes;
        if (Status s = codec::encode_chunk(*profile, *kv.view().slice(ranges[i]), L, bytes); !s.ok()) return fail(s);
        if (Status s = (*client)->put(ctx, i, L, std::as_bytes(std::span(bytes)), transport::deadline_in(10s));
            !s.ok())
          return fail(s);
      }
  }

  struct Request {
    std::string context;
    std::chrono::milliseconds budget;
    int priority;
  };
  const std::vector<Request> requests = {
      {"story-1", 300ms, 0}, {"story-2", 300ms, 5}, {"story-3", 2ms, 1}, {"story-1", 300ms, 9}};
  // The runtime's KV memory and what the chunk callbacks use: declared before the
  // scheduler so that they outlive every fetch (the scheduler's destructor cancels
  // and waits for them, even on an early return below).
  std::mutex print_mu;
  std::vector<KvCache> outs;
  for (size_t i = 0; i < requests.size(); ++i) outs.push_back(KvCache::create(kGeom, DType::f16, kTokens).value());

  // --- The runtime side: a pipeline and kvstream's scheduler under our own. -----
  auto pipe = pipeline::Pipeline::create(**client, *profile, {});
  if (!pipe.ok()) return fail(pipe.status());
  pipeline::AdaptivePlan plan;
  plan.chooser = std::shared_ptr<const policy::Chooser>(policy::make_chooser("deadline").value());
  policy::EstimatorOptions eo;
  eo.prior_bits_per_second = 2e9;  // until the first transfer is observed
  plan.estimators = std::shared_ptr<policy::EstimatorSet>(policy::EstimatorSet::create("ewma", eo).value());
  plan.peer = (*server)->address();
  plan.level_quality_loss = {0.3, 0.8, 2.0, 5.0};  // e.g. perplexity increase %, from the profile's evaluation
  plan.decode_seconds_per_byte = decode_seconds_per_byte;
  plan.recompute_tokens_per_second = 1500;          // this GPU's prefill rate (the runtime knows it)
  pipeline::SchedulerConfig scfg;
  scfg.max_running = 2;
  auto sched = pipeline::Scheduler::create(**pipe, **client, plan, scfg);
  if (!sched.ok()) return fail(sched.status());

  std::vector<std::pair<size_t, std::shared_ptr<pipeline::Ticket>>> submitted;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& rq = requests[i];
    pipeline::ScheduledFetch f;
    f.request.context = rq.context;
    f.request.destination = outs[i].view();
    f.request.chunks = ranges;
    f.request.deadline = transport::deadline_in(rq.budget);
    f.priority = rq.priority;
    f.chunk_tokens.assign(ranges.size(), kChunkTokens);
    f.on_chunk = [&print_mu, i](const pipeline::ChunkTimings& t) {
      std::lock_guard lk(print_mu);
      const bool text = t.decision.action == pipeline::ChunkDecision::Action::recompute;
      fmt::print("  request {} chunk {}: {} {}\n", i, t.chunk,
                 text ? std::string("text") : fmt::format("level {}", t.decision.level),
                 t.status.ok() ? fmt::format("({} bytes)", t.bytes) : t.status.to_string());
    };
    // Admission: fetch, or recompute from text?
    auto adm = (*sched)->predict(f);
    if (!adm.ok() && adm.status().code() == StatusCode::timed_out) {
      // The budget ran out before the stored sizes came back (a 2 ms budget on a
      // busy machine): too late to fetch anything.
      fmt::print("request {} ({}, budget {} ms): {} -> prefill from text\n", i, rq.context, rq.budget.count(),
                 adm.status().to_string());
      continue;
    }
    if (!adm.ok()) return fail(adm.status());
    fmt::print("request {} ({}, budget {} ms, priority {}): predicted {:.1f} ms, wait {:.1f} ms, loss {:.2f}%, "
               "{} of {} chunks as text, link share {:.2f} Gbit/s -> ",
               i, rq.context, rq.budget.count(), rq.priority, adm->predicted_seconds * 1e3, adm->queue_seconds * 1e3,
               adm->mean_quality_loss, adm->recompute_chunks, ranges.size(), adm->link_bits_per_second / 1e9);
    // Our rule: fetch when predicted within 80% of the budget (the forecast assumes
    // the link holds steady) and mostly from the cache.
    if (!adm->fits || adm->predicted_seconds > 0.8 * double(rq.budget.count()) / 1e3 ||
        adm->recompute_chunks * 2 > ranges.size()) {
      fmt::print("prefill from text\n");
      continue;
    }
    fmt::print("fetch\n");
    auto t = (*sched)->submit(std::move(f));
    if (!t.ok() && t.status().code() == StatusCode::timed_out) {
      fmt::print("request {}: {} before it was queued -> prefill from text\n", i, t.status().to_string());
      continue;
    }
    if (!t.ok()) return fail(t.status());
    submitted.emplace_back(i, *t);
  }
  if (submitted.size() >= 2) submitted[1].second->cancel();  // that user went away
  int failures = 0;
  for (auto& [i, t] : submitted) {
    const Status s = t->wait();
    double last_ms = 0;
    for (const auto& ct : t->timings())
      if (ct.delivered != transport::Clock::time_point{} && ct.queued != transport::Clock::time_point{})
        last_ms = std::max(last_ms, std::chrono::duration<double, std::milli>(ct.delivered - ct.queued).count());
    fmt::print("request {}: {} (last chunk {:.1f} ms after it was queued)\n", i, s.ok() ? "done" : s.to_string(),
               last_ms);
    // A missed budget is an outcome (the runtime would recompute the rest); any
    // other error is a failure of this example.
    if (!s.ok() && s.code() != StatusCode::cancelled && s.code() != StatusCode::timed_out) ++failures;
  }
  return failures ? 1 : 0;
}
