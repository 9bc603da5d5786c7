// KvStore against a real storage node on loopback: put, lookup of partial and full
// prefixes, a shared prefix stored once, fetch into packed and paged views equal to
// decoding each chunk alone, the adaptive fetch, wrong model or profile finds nothing,
// a put cut short is never found, remove and eviction (asked for, and when the node
// has no space); and StoreConfig's table.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>

#include "kvstream/gpu.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/kvstream.hpp"
#include "store/chunk_record.hpp"
#include "tests/store/store_test_fixture.hpp"
#include "tests/support/hang_guard.hpp"
#include "tests/support/raw_peer.hpp"
#include "tests/support/test_certs.hpp"

using namespace kvstream;
using namespace kvstream::store_test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

TEST_F(StoreTest, PutThenLookupFullAndPartialPrefixes) {
  KvStore store = open(config());
  const auto tokens = tokens_from(1);
  EXPECT_EQ(*store.lookup(tokens, soon()), 0u);
  auto put = store.put(tokens, kv_.view(), soon());
  ASSERT_TRUE(put.ok()) << put.status().to_string();
  EXPECT_EQ(put->chunks, kTokens / kChunk);  // 5 whole chunks; the 20-token tail is not stored
  EXPECT_EQ(put->already_stored, 0u);
  EXPECT_EQ(put->tokens, 480u);
  EXPECT_GT(put->bytes, 0u);
  EXPECT_EQ(*store.lookup(tokens, soon()), 480u);
  // A prompt that is a prefix (in whole chunks and not), or extends the stored one.
  EXPECT_EQ(*store.lookup(std::span(tokens).first(200), soon()), 192u);
  EXPECT_EQ(*store.lookup(std::span(tokens).first(95), soon()), 0u);
  auto longer = tokens;
  longer.insert(longer.end(), 300, 7);
  EXPECT_EQ(*store.lookup(longer, soon()), 480u);
  // A prompt that differs in chunk 2 finds chunks 0 and 1 only: every later key
  // depends on every earlier token.
  auto edited = tokens;
  edited[2 * kChunk + 5] ^= 1;
  EXPECT_EQ(*store.lookup(edited, soon()), 2u * kChunk);
}

TEST_F(StoreTest, SharedPrefixIsStoredOnce) {
  KvStore store = open(config());
  const auto a = tokens_from(1);
  auto b = a;
  for (uint32_t t = 3 * kChunk; t < kTokens; ++t) b[t] = Token((b[t] + 11) % 512);  // diverges in chunk 3
  ASSERT_TRUE(store.put(a, kv_.view(), soon()).ok());
  auto kv_b = synthetic_kv(8);  // the shared chunks' KV is taken as stored, whatever b's holds there
  auto put_b = store.put(b, kv_b.view(), soon());
  ASSERT_TRUE(put_b.ok());
  EXPECT_EQ(put_b->already_stored, 3u);
  EXPECT_EQ(*store.lookup(b, soon()), 480u);
  auto contexts = store.client().list(soon());
  ASSERT_TRUE(contexts.ok());
  EXPECT_EQ(contexts->size(), 5u + 2u);  // a's five chunks, and b's last two
  const auto ka = store.chunk_keys(a), kb = store.chunk_keys(b);
  ASSERT_EQ(ka.size(), 5u);
  EXPECT_EQ(std::vector(ka.begin(), ka.begin() + 3), std::vector(kb.begin(), kb.begin() + 3));
  EXPECT_NE(ka[3], kb[3]);
}

// The front door to a node over TLS, logging in by client certificate alone (mutual
// TLS mapped to the namespace), with the node's objects encrypted at rest: set
// through StoreConfig's text settings, as a host's config file would.
TEST_F(StoreTest, OverMutualTlsToANodeEncryptedAtRest) {
  const auto certs = kvstream::testing::make_test_certs((dir_ / "certs").string(), "tenant-a");
  ASSERT_TRUE(certs.ok()) << certs.error;
  const std::string keys = (dir_ / "at-rest.keys").string();
  {
    std::FILE* f = std::fopen(keys.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n", f);
    std::fclose(f);
  }
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = (dir_ / "tls-node").string();
  sc.backend.tcp.tls.enabled = true;
  sc.backend.tcp.tls.cert_file = certs.server_cert;
  sc.backend.tcp.tls.key_file = certs.server_key;
  sc.backend.tcp.tls.ca_file = certs.ca;
  sc.tls_clients = {{"ns", {"tenant-a"}}};
  sc.at_rest.key_file = keys;
  auto node = storage::Server::start(sc);
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  StoreConfig c = config();
  c.storage.address = (*node)->address();
  c.storage.secret.clear();
  for (const std::string& kv : {std::string("storage.tls=true"), "storage.tls_ca_file=" + certs.ca,
                                "storage.tls_cert_file=" + certs.client_cert, "storage.tls_key_file=" + certs.client_key})
    ASSERT_TRUE(c.set(kv).ok()) << kv;
  KvStore store = open(c);
  const auto tokens = tokens_from(3);
  ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
  FetchOptions o;
  o.level = 0;
  auto out = KvCache::create(kGeom, DType::f16, 480).value();
  auto f = store.fetch(std::span(tokens).first(480), {.host = out.view()}, soon(), o);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE(f->wait().ok());
  const KvCache want = reference(5, 0);
  EXPECT_TRUE(std::equal(out.bytes().begin(), out.bytes().end(), want.bytes().begin()));
  // Without the certificate the namespace stays closed.
  StoreConfig no_cert = c;
  no_cert.storage.tls.cert_file.clear(), no_cert.storage.tls.key_file.clear();
  EXPECT_EQ(KvStore::open(no_cert).status().code(), StatusCode::permission_denied);
}

TEST_F(StoreTest, FetchIntoPackedAndPagedViewsEqualsEachChunkDecodedAlone) {
  KvStore store = open(config());
  const auto tokens = tokens_from(1);
  ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
  const KvCache want = reference(5, 0);
  FetchOptions o;
  o.level = 0;
  // Packed, with room for the tokens the runtime prefills after the fetched prefix.
  auto packed = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto f = store.fetch(tokens, {.host = packed.view()}, soon(), o);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto report = f->wait();
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->tokens, 480u);
  EXPECT_TRUE(report->recompute.empty());
  EXPECT_EQ(report->chunks.size(), 5u);
  auto head = *packed.view().slice({0, 480});
  auto got = KvCache::create(kGeom, DType::f16, 480).value();
  ASSERT_TRUE(copy_kv(head, got.view()).ok());
  ASSERT_EQ(got.bytes().size(), want.bytes().size());
  EXPECT_TRUE(std::equal(got.bytes().begin(), got.bytes().end(), want.bytes().begin()));

  // Paged as vLLM lays it out: per layer [2][blocks][16][kv_heads][head_dim], blocks
  // shuffled.
  constexpr uint32_t kBlock = 16, kBlocks = 40;
  const uint64_t C = kGeom.channels();
  std::vector<std::vector<uint16_t>> layers(kGeom.layers, std::vector<uint16_t>(2 * kBlocks * kBlock * C));
  PagedLayout pl;
  for (auto& l : layers) pl.layer_base.push_back(l.data());
  pl.block_size = kBlock;
  pl.plane_stride = int64_t(kBlocks * kBlock * C);
  pl.block_stride = int64_t(kBlock * C);
  pl.slot_stride = int64_t(C);
  pl.num_blocks = kBlocks;
  pl.block_table.resize(480 / kBlock);
  std::iota(pl.block_table.begin(), pl.block_table.end(), 0u);
  std::shuffle(pl.block_table.begin(), pl.block_table.end(), std::mt19937(3));
  auto paged = KvView::paged(pl, DType::f16, kGeom, 480).value();
  auto f2 = store.fetch(tokens, {.host = paged}, soon(), o);
  ASSERT_TRUE(f2.ok());
  ASSERT_TRUE(f2->wait().ok());
  auto back = KvCache::create(kGeom, DType::f16, 480).value();
  ASSERT_TRUE(copy_kv(paged, back.view()).ok());
  EXPECT_TRUE(std::equal(back.bytes().begin(), back.bytes().end(), want.bytes().begin()));
}

// Device memory is a GPU pipeline's destination (pipeline.decode gpu): a CPU store
// refuses it before anything is fetched, and a destination that cannot hold the stored
// prefix is refused too.
TEST_F(StoreTest, DestinationsThatCannotTakeTheFetchAreRefused) {
  KvStore store = open(config());
  const auto tokens = tokens_from(1);
  ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
  std::vector<std::byte> fake(64);
  FetchDestination device;
  device.device.chunks.assign(5, fake.data());
  auto f = store.fetch(tokens, device, soon());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::invalid_argument) << f.status().to_string();
  // A view in device memory on a store that decodes on the CPU, and two destinations.
  auto whole = KvCache::create(kGeom, DType::f16, kv_.tokens()).value();
  FetchDestination on_device;
  on_device.device_view = whole.view();
  auto d = store.fetch(tokens, on_device, soon());
  EXPECT_EQ(d.status().code(), StatusCode::invalid_argument) << d.status().to_string();
  EXPECT_NE(d.status().message().find("GPU"), std::string::npos) << d.status().to_string();
  on_device.host = whole.view();
  EXPECT_EQ(store.fetch(tokens, on_device, soon()).status().code(), StatusCode::invalid_argument);
  auto small = KvCache::create(kGeom, DType::f16, 100).value();
  auto g = store.fetch(tokens, {.host = small.view()}, soon());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::invalid_argument);
  // Asking for fewer tokens makes the same destination fit.
  FetchOptions o;
  o.max_tokens = 100;
  o.level = 0;
  auto h = store.fetch(tokens, {.host = small.view()}, soon(), o);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto r = h->wait();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens, uint64_t(kChunk));
}

TEST_F(StoreTest, AdaptiveFetchDeliversEveryChunkWithinTheQualityBound) {
  KvStore store = open(config());
  const auto tokens = tokens_from(1);
  ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
  auto plan = store.plan(tokens, soon());
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->tokens, 480u);
  EXPECT_EQ(plan->decisions.size(), 5u);
  EXPECT_TRUE(plan->fits);
  auto dest = KvCache::create(kGeom, DType::f16, 480).value();
  std::atomic<int> seen{0};
  FetchOptions o;
  o.on_chunk = [&](const pipeline::ChunkTimings& t) {
    if (t.status.ok()) ++seen;
  };
  auto f = store.fetch(tokens, {.host = dest.view()}, soon(), std::move(o));
  ASSERT_TRUE(f.ok());
  auto r = f->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(seen.load(), 5);
  EXPECT_EQ(r->tokens, 480u);
  EXPECT_GT(r->bytes, 0u);
  // Every chunk decodes to what its chosen level gives alone.
  for (const auto& t : r->chunks) {
    ASSERT_EQ(t.decision.action, pipeline::ChunkDecision::Action::fetch);
    const KvCache want = reference(5, t.decision.level);
    const TokenRange range{t.chunk * kChunk, (t.chunk + 1) * kChunk};
    auto a = KvCache::create(kGeom, DType::f16, kChunk).value(), b = KvCache::create(kGeom, DType::f16, kChunk).value();
    ASSERT_TRUE(copy_kv(*dest.view().slice(range), a.view()).ok());
    ASSERT_TRUE(copy_kv(*want.view().slice(range), b.view()).ok());
    EXPECT_TRUE(std::equal(a.bytes().begin(), a.bytes().end(), b.bytes().begin())) << "chunk " << t.chunk;
  }
}

// A progressive profile stores each chunk once, as one object whose parts are its
// levels' prefixes; a fetch at the coarsest level, refined after the first token,
// ends bit for bit as a fetch at the finest, having moved only what was missing.
TEST_F(StoreTest, ProgressiveChunksAreOneObjectAndRefineInPlace) {
  use_progressive_profile();
  KvStore store = open(config("progressive"));
  const auto tokens = tokens_from(4);
  auto put = store.put(tokens, kv_.view(), soon());
  ASSERT_TRUE(put.ok()) << put.status().to_string();
  uint64_t stored = 0, coarse = 0;
  std::vector<uint64_t> base_end;
  for (const std::string& key : store.chunk_keys(tokens)) {
    auto st = store.client().stat(key, soon());
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    for (const storage::ChunkStat& c : *st) {
      if (c.chunk != 0) continue;
      ASSERT_EQ(c.level_bytes.size(), 1u) << "one object per chunk";
      ASSERT_EQ(c.level_parts.size(), 1u);
      ASSERT_EQ(c.level_parts[0].size(), 3u) << "a part per level";
      EXPECT_EQ(c.level_parts[0].back().end, c.level_bytes[0]);
      EXPECT_GT(c.level_parts[0][0].score, c.level_parts[0][2].score) << "distortion falls with the level";
      stored += c.level_bytes[0], coarse += c.level_parts[0][0].end;
      base_end.push_back(c.level_parts[0][0].end);
    }
  }
  EXPECT_EQ(put->bytes, stored);
  ASSERT_EQ(store.lookup(tokens, soon()).value(), 480u);
  // The stored context's last chunk codes its last tokens finer; the others do not.
  ASSERT_GT(profile_.recent_tokens(), 0u);
  const std::vector<std::string> keys = store.chunk_keys(tokens);
  ASSERT_EQ(base_end.size(), keys.size());
  std::vector<uint8_t> head(coarse);
  auto region = store.client().register_memory(head.data(), head.size());
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = store.client().get_range(keys[i], store::kLevelsChunk, 0, 0, base_end[i], *region, 0, soon());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    auto info = codec::inspect_chunk(std::span(head).first(base_end[i]));
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    EXPECT_EQ(info->recent_tokens, i + 1 == keys.size() ? std::min<uint32_t>(profile_.recent_tokens(), kChunk) : 0u)
        << "chunk " << i;
  }

  auto dest = KvCache::create(kGeom, DType::f16, 480).value();
  FetchOptions o;
  o.level = 2;
  o.keep_for_refinement = true;
  auto f = store.fetch(tokens, {.host = dest.view()}, soon(), o);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto r = f->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->bytes, coarse);
  const KvCache want_coarse = reference(5, 2);
  EXPECT_TRUE(std::equal(dest.bytes().begin(), dest.bytes().end(), want_coarse.bytes().begin()));

  auto refined = f->refine(0, soon());
  ASSERT_TRUE(refined.ok()) << refined.status().to_string();
  EXPECT_EQ(refined->chunks_refined, 5u);
  EXPECT_EQ(refined->bytes, stored - coarse);
  const KvCache want_fine = reference(5, 0);
  EXPECT_TRUE(std::equal(dest.bytes().begin(), dest.bytes().end(), want_fine.bytes().begin()));
  EXPECT_FALSE(std::equal(want_fine.bytes().begin(), want_fine.bytes().end(), want_coarse.bytes().begin()));
  // Within a budget: none leaves everything as fetched; a generous one takes every
  // chunk to the finest level, as refine(0) does.
  {
    auto g = store.fetch(tokens, {.host = dest.view()}, soon(), o);
    ASSERT_TRUE(g.ok() && g->wait().ok());
    auto none = g->refine_within(std::chrono::duration<double>(0), soon());
    ASSERT_TRUE(none.ok()) << none.status().to_string();
    EXPECT_EQ(none->chunks_refined, 0u);
    EXPECT_TRUE(std::equal(dest.bytes().begin(), dest.bytes().end(), want_coarse.bytes().begin()));
    auto all = g->refine_within(std::chrono::seconds(100), soon());
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    EXPECT_EQ(all->chunks_refined, 5u);
    EXPECT_EQ(all->bytes, stored - coarse);
    EXPECT_TRUE(std::equal(dest.bytes().begin(), dest.bytes().end(), want_fine.bytes().begin()));
    EXPECT_EQ(g->refine_within(std::chrono::duration<double>(-1), soon()).status().code(),
              StatusCode::invalid_argument);
  }
  // Already there: nothing moves.
  auto again = f->refine(0, soon());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->chunks_refined, 0u);
  EXPECT_EQ(again->bytes, 0u);
  // Without keep_for_refinement there is nothing to refine from.
  auto plain = store.fetch(tokens, {.host = dest.view()}, soon(), FetchOptions{.level = 2});
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(plain->wait().ok());
  EXPECT_EQ(plain->refine(0, soon()).status().code(), StatusCode::invalid_argument);
}

// Device KV is refined on its GPU as host KV is on the CPU: fetched at the base level
// into device memory with keep_for_refinement, then refined to the finest, it equals
// each chunk decoded alone at that level, after both steps.
TEST_F(StoreTest, DeviceKvRefinesOnTheGpu) {
  const auto probe = gpu::probe_device();
  if (!probe.ok())
    GTEST_SKIP() << probe.status().message() << " -- device refinement is checked on a GPU machine (perf/gpu/run.sh)";
  use_progressive_profile();
  StoreConfig c = config("progressive");
  c.pipeline.decode = "gpu";
  KvStore store = open(c);
  const auto tokens = tokens_from(4);
  ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
  auto host = KvCache::create(kGeom, DType::f16, 480).value();
  auto dev = gpu::DeviceBuffer::allocate(host.bytes().size());
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  FetchDestination d;
  d.device_view = KvView::packed(dev->data(), DType::f16, kGeom, 480).value();
  FetchOptions o;
  o.level = 2;
  o.keep_for_refinement = true;
  auto f = store.fetch(tokens, d, soon(), o);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE(f->wait().ok());
  ASSERT_TRUE(gpu::copy_to_host(host.bytes().data(), dev->data(), host.bytes().size()).ok());
  const KvCache want_coarse = reference(5, 2);
  EXPECT_TRUE(std::equal(host.bytes().begin(), host.bytes().end(), want_coarse.bytes().begin()));
  auto refined = f->refine(0, soon());
  ASSERT_TRUE(refined.ok()) << refined.status().to_string();
  EXPECT_EQ(refined->chunks_refined, 5u);
  ASSERT_TRUE(gpu::copy_to_host(host.bytes().data(), dev->data(), host.bytes().size()).ok());
  const KvCache want_fine = reference(5, 0);
  EXPECT_TRUE(std::equal(host.bytes().begin(), host.bytes().end(), want_fine.bytes().begin()));
}

// Without a usable GPU, a refinement of device KV is a clear error naming the GPU, and
// the kept prefixes stay as they were (called on the pipeline directly: a store without
// a GPU cannot have fetched into device memory in the first place).
TEST_F(StoreTest, RefiningDeviceKvWithoutAGpuIsAClearErrorAndKeepsThePrefixes) {
  if (gpu::probe_device().ok()) GTEST_SKIP() << "a GPU is present: DeviceKvRefinesOnTheGpu covers it";
  use_progressive_profile();
  KvStore store = open(config("progressive"));
  const auto tokens = tokens_from(4);
  ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
  auto dest = KvCache::create(kGeom, DType::f16, 480).value();
  pipeline::RefineRequest rq;
  rq.fetch.stored_contexts = store.chunk_keys(tokens);
  rq.fetch.context = rq.fetch.stored_contexts.front();
  rq.fetch.stored_chunks.assign(rq.fetch.stored_contexts.size(), store::kLevelsChunk);
  for (uint32_t i = 0; i < rq.fetch.stored_contexts.size(); ++i) {
    rq.fetch.chunks.push_back({i * kChunk, (i + 1) * kChunk});
    // Each chunk's base prefix, as a fetch at level 2 keeps it.
    auto stat = store.client().stat(rq.fetch.stored_contexts[i], soon());
    ASSERT_TRUE(stat.ok()) << stat.status().to_string();
    const uint64_t base = stat->front().level_parts[0][0].end;
    std::vector<uint8_t> bytes(base);
    auto region = store.client().register_memory(bytes.data(), bytes.size());
    ASSERT_TRUE(region.ok());
    ASSERT_TRUE(store.client().get_range(rq.fetch.stored_contexts[i], store::kLevelsChunk, 0, 0, base, *region, 0,
                                         soon()).ok());
    rq.kept.push_back(std::move(bytes));
  }
  const auto kept = rq.kept;
  rq.fetch.destination = dest.view();
  rq.fetch.destination_memory = transport::MemoryType::cuda;
  rq.fetch.deadline = soon();
  auto r = pipeline::refine_fetch(store.client(), profile_, rq);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().code() == StatusCode::unavailable || r.status().code() == StatusCode::unsupported)
      << r.status().to_string();
  EXPECT_NE(r.status().message().find("GPU"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(rq.kept, kept);
  // The same request for host memory refines every chunk: the failure above was the GPU's.
  rq.fetch.destination_memory = transport::MemoryType::host;
  auto host = pipeline::refine_fetch(store.client(), profile_, rq);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  EXPECT_EQ(host->chunks_refined, 5u);
}

// A fetch right after a lookup takes the sizes the lookup read: it asks the node for
// the chunks only (one get each), where with storage.stat_reuse_ms 0 it stats again.
// The reuse window is an hour, not the default 2 s: the fetch must come within it
// however slow the machine (a 2 s window could close first under the sanitizers).
TEST_F(StoreTest, AFetchRightAfterALookupDoesNotStatAgain) {
  for (const int reuse_ms : {3600 * 1000, 0}) {
    StoreConfig c = config(fmt::format("reuse-{}", reuse_ms));
    c.storage.stat_reuse = std::chrono::milliseconds(reuse_ms);
    KvStore store = open(c);
    const auto tokens = tokens_from(1);
    ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
    ASSERT_EQ(*store.lookup(tokens, soon()), 480u);
    auto dest = KvCache::create(kGeom, DType::f16, 480).value();
    FetchOptions o;
    o.level = 1;
    const uint64_t before = server_->counters().requests;
    auto f = store.fetch(tokens, {.host = dest.view()}, soon(), o);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->wait().ok());
    // The gets (and with stat_reuse 0 the stats again), and one request beside them
    // that marks the chunks used (it may still be on its way when wait returns).
    const uint64_t want = reuse_ms ? 6u : 11u;
    EXPECT_TRUE(kvstream::testing::eventually([&] { return server_->counters().requests - before >= want; }));
    EXPECT_EQ(server_->counters().requests - before, want) << "stat_reuse " << reuse_ms << " ms";
  }
}

TEST_F(StoreTest, AnotherModelOrProfileFindsNothing) {
  const auto tokens = tokens_from(1);
  {
    KvStore store = open(config());
    ASSERT_TRUE(store.put(tokens, kv_.view(), soon()).ok());
  }
  KvStore other_model = open(config("another-model"));
  EXPECT_EQ(*other_model.lookup(tokens, soon()), 0u);
  auto dest = KvCache::create(kGeom, DType::f16, 480).value();
  auto f = other_model.fetch(tokens, {.host = dest.view()}, soon());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::not_found);
  // The same model with a profile of other steps: another hash, other keys.
  const auto other_path = (dir_ / "q.kvsprofile").string();
  ASSERT_TRUE(make_profile(5, {0.2f, 0.5f}).save_file(other_path).ok());
  StoreConfig c = config();
  c.codec.profile_path = other_path;
  KvStore other_profile = open(c);
  EXPECT_EQ(*other_profile.lookup(tokens, soon()), 0u);
  // KV of another geometry is refused before anything is stored.
  const KvGeometry g2{2, 2, 16, 4, AttentionKind::gqa};
  auto wrong = KvCache::create(g2, DType::f32, kTokens).value();
  auto put = other_profile.put(tokens, wrong.view(), soon());
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), StatusCode::invalid_argument);
}

TEST_F(StoreTest, AChunkWhosePutWasCutShortIsNotFound) {
  KvStore store = open(config());
  const auto tokens = tokens_from(1);
  const auto keys = store.chunk_keys(tokens);
  // Levels of chunk 0 without its record: what a writer that died mid-put leaves.
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(codec::encode_chunk(profile_, *kv_.view().slice({0, kChunk}), 0, bytes).ok());
  ASSERT_TRUE(store.client().put(keys[0], store::kLevelsChunk, 0, std::as_bytes(std::span(bytes)), soon()).ok());
  EXPECT_EQ(*store.lookup(tokens, soon()), 0u);
  // A later put completes it.
  auto put = store.put(tokens, kv_.view(), soon());
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->already_stored, 0u);
  EXPECT_EQ(*store.lookup(tokens, soon()), 480u);
}

TEST_F(StoreTest, RemoveAndEvictByAgeAndSize) {
  KvStore store = open(config());
  const auto a = tokens_from(1), b = tokens_from(2);
  ASSERT_TRUE(store.put(a, kv_.view(), soon()).ok());
  ASSERT_TRUE(store.put(b, kv_.view(), soon()).ok());
  EXPECT_EQ(*store.remove(std::span(a).first(2 * kChunk), soon()), 2u);
  EXPECT_EQ(*store.lookup(a, soon()), 0u);  // chunk 0 is gone, so nothing after it is found
  // Nothing is older than an hour; a size bound keeps the newest chunks.
  auto none = store.evict(0, std::chrono::hours(1), soon());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->chunks_removed, 0u);
  const uint64_t all = none->bytes_kept;
  ASSERT_GT(all, 0u);
  auto half = store.evict(all / 2, 0s, soon());
  ASSERT_TRUE(half.ok()) << half.status().to_string();
  EXPECT_GT(half->chunks_removed, 0u);
  EXPECT_LE(half->bytes_kept, all / 2);
  EXPECT_EQ(half->bytes_kept + half->bytes_removed, all);
  // The deepest chunks went first: b (five chunks) keeps a prefix, and every chunk
  // still stored is reachable (no head removed before its tail).
  const uint64_t kept_b = *store.lookup(b, soon());
  EXPECT_GE(kept_b, 2u * kChunk);
  auto left = store.client().list(soon());
  ASSERT_TRUE(left.ok());
  const auto kb = store.chunk_keys(b);
  size_t reachable = kept_b / kChunk;
  for (const auto& k : *left)
    if (std::find(kb.begin(), kb.end(), k) != kb.end()) EXPECT_LT(size_t(std::find(kb.begin(), kb.end(), k) - kb.begin()), reachable) << k;
}

// Which of a's chunks are stored, by index.
std::vector<size_t> stored_chunks(KvStore& store, const std::vector<Token>& tokens) {
  const auto keys = store.chunk_keys(tokens);
  std::vector<size_t> out;
  const auto listed = store.client().list(soon());  // kept: the loop reads into it
  EXPECT_TRUE(listed.ok()) << listed.status().to_string();
  if (!listed.ok()) return out;
  for (const auto& k : *listed)
    if (auto it = std::find(keys.begin(), keys.end(), k); it != keys.end()) out.push_back(size_t(it - keys.begin()));
  std::sort(out.begin(), out.end());
  return out;
}

// A node with no space left for the tenant (its quota): a put fails no_space and
// removes nothing. With eviction.when_full it removes other prompts' chunks, deepest
// first, never its own and never one without a record (another store may be writing
// it), until it fits; what is left of them is whole prefixes.
TEST_F(StoreTest, APutIntoAFullStoreEvictsOnlyWhenAsked) {
  KvStore plain = open(config());
  const auto a = tokens_from(1), b = tokens_from(2);
  ASSERT_TRUE(plain.put(a, kv_.view(), soon()).ok());
  // Level 0 of another prompt's chunk 0 and no record: a put under way elsewhere.
  const std::string writing = plain.chunk_keys(tokens_from(4))[0];
  std::vector<uint8_t> level0;
  ASSERT_TRUE(codec::encode_chunk(profile_, *kv_.view().slice({0, kChunk}), 0, level0).ok());
  ASSERT_TRUE(plain.client().put(writing, store::kLevelsChunk, 0, std::as_bytes(std::span(level0)), soon()).ok());
  const uint64_t used_a = quota_bytes_used();
  ASSERT_GT(used_a, 0u);
  server_->set_namespace_quotas(used_a + used_a / 2, {});  // a and about half of b
  auto refused = plain.put(b, kv_.view(), soon());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::no_space) << refused.status().to_string();
  EXPECT_EQ(*plain.lookup(a, soon()), 480u) << "a put without eviction.when_full removed a chunk";
  const uint64_t b_before = *plain.lookup(b, soon());
  EXPECT_GT(b_before, 0u);
  EXPECT_LT(b_before, 480u);

  StoreConfig c = config();
  ASSERT_TRUE(c.set("eviction.when_full", "true").ok());
  KvStore evicting = open(c);
  auto put = evicting.put(b, kv_.view(), soon());
  ASSERT_TRUE(put.ok()) << put.status().to_string();
  EXPECT_GT(put->evicted_chunks, 0u);
  EXPECT_GT(put->evicted_bytes, 0u);
  EXPECT_EQ(put->already_stored, b_before / kChunk) << "b's own stored chunks were kept";
  EXPECT_EQ(*evicting.lookup(b, soon()), 480u);
  const uint64_t kept_a = *evicting.lookup(a, soon());
  EXPECT_LT(kept_a, 480u);
  std::vector<size_t> want(kept_a / kChunk);
  std::iota(want.begin(), want.end(), size_t(0));
  EXPECT_EQ(stored_chunks(evicting, a), want) << "a chunk of a is stored past its stored prefix";
  EXPECT_LE(quota_bytes_used(), used_a + used_a / 2);
  // With nothing else left to remove, a put that does not fit fails no_space.
  server_->set_namespace_quotas(1, {});
  auto none = evicting.put(tokens_from(3), kv_.view(), soon());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::no_space) << none.status().to_string();
  EXPECT_EQ(*evicting.lookup(a, soon()), 0u) << "everything with a record went";
  EXPECT_TRUE(evicting.client().stat(writing, soon()).ok()) << "a chunk without a record was evicted";
}

// A busy node (its memory budget held by puts in flight) answers resource_exhausted:
// waiting helps there, so even with eviction.when_full a put removes nothing.
TEST_F(StoreTest, ABusyNodeNeverMakesAPutEvict) {
  const auto a = tokens_from(1), b = tokens_from(2);
  {
    KvStore store = open(config());
    ASSERT_TRUE(store.put(a, kv_.view(), soon()).ok());
  }
  server_.reset();  // the same directory under a node with room for two body segments
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = (dir_ / "node").string();
  sc.secrets = {{"ns", kSecret}};
  sc.cache_bytes = 0;
  sc.memory_budget_bytes = 2 * storage::kSegmentBytes;
  server_ = std::move(storage::Server::start(sc)).value();
  // Two puts that declare the largest body and send 1 KiB hold both segments.
  std::vector<kvstream::testing::RawPeer> holders(2);
  const std::vector<std::byte> kib(1024, std::byte{7});
  for (size_t i = 0; i < holders.size(); ++i) {
    ASSERT_TRUE(holders[i].connect(server_->address()));
    ASSERT_TRUE(holders[i].authenticate("ns", kSecret));
    storage::Request put;
    put.op = storage::Op::put, put.id = 1, put.context = "held", put.chunk = uint32_t(i);
    put.total = storage::kMaxChunkBytes;
    ASSERT_TRUE(holders[i].send_message(storage::encode(put), storage::kSegmentBytes, kib));
  }
  ASSERT_TRUE(kvstream::testing::eventually(
      [&] { return server_->counters().budget_peak_bytes >= 2 * storage::kSegmentBytes; }));
  StoreConfig c = config();
  ASSERT_TRUE(c.set("eviction.when_full", "true").ok());
  KvStore store = open(c);
  auto put = store.put(b, kv_.view(), soon());
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), StatusCode::resource_exhausted) << put.status().to_string();
  EXPECT_EQ(*store.lookup(a, soon()), 480u) << "a busy node made the put evict";
}

TEST(StoreConfigTest, EvictionWhenFullSettings) {
  StoreConfig c;
  c.codec.profile_path = "p", c.codec.model_id = "m";
  EXPECT_FALSE(c.eviction.when_full);  // off unless asked: a full store fails puts
  ASSERT_TRUE(c.set("eviction.when_full", "true").ok());
  ASSERT_TRUE(c.set("eviction.when_full_fraction", "0.2").ok());
  EXPECT_TRUE(c.eviction.when_full);
  EXPECT_DOUBLE_EQ(c.eviction.when_full_fraction, 0.2);
  EXPECT_TRUE(c.validate().ok());
  ASSERT_TRUE(c.set("eviction.when_full_fraction", "1.5").ok());
  EXPECT_EQ(c.validate().code(), StatusCode::invalid_argument);
}

TEST(StoreConfigTest, TableSetGetEnvAndDescribe) {
  StoreConfig c;
  ASSERT_TRUE(c.set("storage.address", "10.0.0.1:7000").ok());
  ASSERT_TRUE(c.set("codec.chunk_tokens=128").ok());
  ASSERT_TRUE(c.set("storage.nodes", "a:1,b:2").ok());
  ASSERT_TRUE(c.set("policy.max_quality_loss_pct", "0.5").ok());
  EXPECT_EQ(c.storage.address, "10.0.0.1:7000");
  EXPECT_EQ(c.codec.chunk_tokens, 128u);
  EXPECT_EQ(c.storage.nodes, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(*c.get("storage.nodes"), "a:1,b:2");
  EXPECT_EQ(c.set("no.such", "1").code(), StatusCode::not_found);
  EXPECT_EQ(c.set("codec.chunk_tokens", "-3").code(), StatusCode::invalid_argument);
  EXPECT_EQ(c.set("policy.prior_bits_per_second", "fast").code(), StatusCode::invalid_argument);
  EXPECT_EQ(c.validate().code(), StatusCode::invalid_argument);  // no profile, no model id

  ::setenv("KVSTREAM_STORAGE_SECRET", "from-the-environment", 1);
  ::setenv("KVSTREAM_PIPELINE_DEPTH", "7", 1);
  auto e = StoreConfig::from_env(c);
  ::unsetenv("KVSTREAM_STORAGE_SECRET");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->storage.secret, "from-the-environment");
  EXPECT_EQ(e->pipeline.depth, 7u);
  EXPECT_EQ(e->storage.address, "10.0.0.1:7000");  // kept from the base
  ::setenv("KVSTREAM_PIPELINE_DEPTH", "deep", 1);
  auto bad = StoreConfig::from_env();
  ::unsetenv("KVSTREAM_PIPELINE_DEPTH");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("KVSTREAM_PIPELINE_DEPTH"), std::string::npos);

  // describe() lists every setting with its default and variable; never a secret.
  const std::string d = e->describe();
  for (const auto& s : store_settings()) {
    EXPECT_NE(d.find(std::string(s.name)), std::string::npos) << s.name;
    EXPECT_NE(d.find(s.env), std::string::npos) << s.env;
    EXPECT_FALSE(s.doc.empty()) << s.name;
  }
  EXPECT_EQ(d.find("from-the-environment"), std::string::npos);
  EXPECT_NE(d.find("pipeline.depth = 7  [default: 4"), std::string::npos) << d;
}

}  // namespace
