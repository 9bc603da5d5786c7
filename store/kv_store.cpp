#include "kvstream/kv_store.hpp"

#include <algorithm>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <system_error>
#include <unordered_set>

#include <fmt/format.h>

#include "core/log.hpp"
#include "kvstream/adaptive_fetch.hpp"
#include "kvstream/policy.hpp"
#include "kvstream/scheduler.hpp"
#include "store/eviction.hpp"
#include "store/kv_store_impl.hpp"
#include "store/storage_client.hpp"

namespace kvstream {

using Clock = transport::Clock;

Result<std::vector<uint64_t>> KvStore::Impl::stat_one(const std::string& key, transport::Deadline deadline,
                                                      const transport::CancelToken& cancel) {
  auto stats = client->stat(key, deadline, cancel);
  if (!stats.ok()) {
    if (stats.status().code() == StatusCode::not_found) return std::vector<uint64_t>{};
    return stats.status();
  }
  std::vector<uint64_t> levels;
  std::vector<double> distortion;
  bool record = false;
  for (const auto& s : *stats) {
    if (s.chunk == store::kLevelsChunk) {
      levels = pipeline::stored_level_bytes(s, profile.progressive());
      if (profile.progressive() && !s.level_parts.empty() && s.level_parts[0].size() == levels.size())
        for (size_t l = 0; l < levels.size(); ++l)
          distortion.push_back(s.level_parts[0][levels.size() - 1 - l].score);
    }
    if (s.chunk == store::kRecordChunk && !s.level_bytes.empty() && s.level_bytes[0] == store::kChunkRecordBytes)
      record = true;
  }
  if (!record || std::none_of(levels.begin(), levels.end(), [](uint64_t b) { return b > 0; })) levels.clear();
  std::lock_guard lk(recent_mu);
  if (recent.size() >= kMaxRecent) recent.clear();
  if (levels.empty())
    recent.erase(key);
  else
    recent[key] = {levels, std::move(distortion), Clock::now()};
  return levels;
}

void KvStore::Impl::mark_used(const std::vector<std::string>& keys, transport::Deadline deadline,
                              const transport::CancelToken& cancel) {
  if (keys.empty() || marks_unsupported.load(std::memory_order_relaxed)) return;
  std::vector<storage::ContextTouch> touches;
  touches.reserve(keys.size());
  for (uint32_t i = 0; i < keys.size(); ++i) touches.push_back({keys[i], i});
  const Status s = client->touch(touches, 0, deadline, cancel);
  if (s.ok()) return;
  if (s.code() == StatusCode::unsupported) {
    if (!marks_unsupported.exchange(true))
      KVS_LOG_INFO("kvstore: the storage keeps no use marks ({}); eviction goes by depth and age", s.message());
    return;
  }
  KVS_LOG_DEBUG("kvstore: marking {} chunks used failed: {}", keys.size(), s.to_string());
}

Result<std::vector<std::vector<uint64_t>>> KvStore::Impl::stat_chunks(const std::vector<std::string>& keys,
                                                                      bool all, transport::Deadline deadline,
                                                                      const transport::CancelToken& cancel,
                                                                      bool reuse) {
  std::vector<std::vector<uint64_t>> out;
  const auto fresh_after = Clock::now() - cfg.storage.stat_reuse;
  for (size_t first = 0; first < keys.size(); first += kParallelStats) {
    const size_t n = std::min(kParallelStats, keys.size() - first);
    std::vector<std::optional<Result<std::vector<uint64_t>>>> got(n);
    if (reuse) {
      std::lock_guard lk(recent_mu);
      for (size_t i = 0; i < n; ++i)
        if (auto it = recent.find(keys[first + i]); it != recent.end() && it->second.when >= fresh_after)
          got[i].emplace(it->second.sizes);
    }
    read_side_by_side(got, [&](size_t i) { return stat_one(keys[first + i], deadline, cancel); });
    for (size_t i = 0; i < n; ++i) {
      if (!got[i]->ok()) return got[i]->status();
      if ((*got[i])->empty() && !all) return out;
      out.push_back(std::move(**got[i]));
    }
  }
  return out;
}

std::vector<std::vector<double>> KvStore::Impl::chunk_losses(const std::vector<std::string>& keys) {
  std::vector<std::vector<double>> out;
  std::lock_guard lk(recent_mu);
  for (const std::string& key : keys) {
    auto it = recent.find(key);
    if (it == recent.end() || it->second.distortion.size() != profile.levels()) return {};
    std::vector<double> loss(profile.levels());
    for (uint32_t l = 0; l < profile.levels(); ++l) {
      const double ref = profile.level(l).distortion;
      loss[l] = ref > 0 ? level_loss(l) * it->second.distortion[l] / ref : level_loss(l);
    }
    out.push_back(std::move(loss));
  }
  return out;
}

namespace {

Result<pipeline::DecodeOn> decode_on(const std::string& s) { return pipeline::parse_decode_on(s); }

uint64_t unix_ms_now() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

Result<KvStore> KvStore::open(const StoreConfig& config) {
  KVS_RETURN_IF_ERROR(config.validate());
  KVS_RETURN_IF_ERROR(config.apply_log_level());
  auto impl = std::make_shared<Impl>();
  impl->cfg = config;
  KVS_ASSIGN_OR_RETURN(impl->profile, codec::Profile::load_file(config.codec.profile_path));
  const codec::Profile& profile = impl->profile;
  KVS_ASSIGN_OR_RETURN(impl->keyer,
                       store::ChunkKeyer::create(config.codec.model_id, profile.hash(), config.codec.chunk_tokens));

  KVS_ASSIGN_OR_RETURN(impl->client,
                       store::connect_storage(config.storage, transport::deadline_in(config.storage.connect_timeout)));
  KVS_ASSIGN_OR_RETURN(impl->record_region,
                       impl->client->register_memory(impl->record_buf.data(), impl->record_buf.size()));

  pipeline::PipelineConfig pc;
  pc.depth = config.pipeline.depth;
  pc.max_chunk_bytes = config.pipeline.max_chunk_bytes;
  pc.decode_threads = config.pipeline.decode_threads;
  KVS_ASSIGN_OR_RETURN(pc.decode, decode_on(config.pipeline.decode));
  pc.gpu_device = config.pipeline.gpu_device;
  pc.max_on_wire = config.pipeline.max_on_wire;
  KVS_ASSIGN_OR_RETURN(impl->pipe, pipeline::Pipeline::create(*impl->client, profile, pc));

  // Quality per level from the profile, made monotone and >= 0 (the finest levels
  // measure within noise of 0, some slightly below). A profile without measurements
  // ranks levels by index, and then no percent bound can apply.
  pipeline::AdaptivePlan& plan = impl->plan;
  bool measured = true;
  for (uint32_t l = 0; l < profile.levels(); ++l) measured = measured && profile.level(l).ppl_increase_pct != -1;
  double worst = 0;
  for (uint32_t l = 0; l < profile.levels(); ++l) {
    worst = std::max(worst, profile.level(l).ppl_increase_pct);
    plan.level_quality_loss.push_back(measured ? worst : double(l));
  }
  policy::ChooserOptions co;
  if (measured && config.policy.max_quality_loss_pct >= 0) co.max_quality_loss = config.policy.max_quality_loss_pct;
  KVS_ASSIGN_OR_RETURN(auto chooser, policy::make_chooser(config.policy.chooser, co));
  plan.chooser = std::move(chooser);
  policy::EstimatorOptions eo;
  eo.prior_bits_per_second = config.policy.prior_bits_per_second;
  KVS_ASSIGN_OR_RETURN(auto estimators, policy::EstimatorSet::create(config.policy.estimator, eo));
  plan.estimators = std::move(estimators);
  plan.peer = store::storage_peer(config.storage);
  plan.decode_workers = config.pipeline.decode_threads;
  // Decode runs at about a fixed rate per element whatever the level, so its cost per
  // encoded byte is 8 / (bits per element x elements per second).
  if (config.policy.decode_elements_per_second > 0)
    for (uint32_t l = 0; l < profile.levels(); ++l) {
      const double bits = profile.level(l).bits_per_element;
      plan.decode_seconds_per_byte.push_back(bits > 0 ? 8.0 / (bits * config.policy.decode_elements_per_second) : 0);
    }
  plan.recompute_tokens_per_second = config.policy.recompute_tokens_per_second;
  pipeline::SchedulerConfig sc;
  sc.max_running = config.pipeline.max_running;
  KVS_ASSIGN_OR_RETURN(impl->scheduler, pipeline::Scheduler::create(*impl->pipe, *impl->client, plan, sc));
  KVS_LOG_INFO("kvstore: open on {} (model {}, profile {:016x}, {} levels, {}-token chunks)", plan.peer,
               config.codec.model_id, profile.hash(), profile.levels(), config.codec.chunk_tokens);
  return KvStore(std::move(impl));
}

KvStore::KvStore(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvStore::KvStore(KvStore&&) noexcept = default;
KvStore& KvStore::operator=(KvStore&&) noexcept = default;
KvStore::~KvStore() = default;

const StoreConfig& KvStore::config() const noexcept { return impl_->cfg; }
const codec::Profile& KvStore::profile() const noexcept { return impl_->profile; }
const KvGeometry& KvStore::geometry() const noexcept { return impl_->profile.geometry(); }
uint32_t KvStore::chunk_tokens() const noexcept { return impl_->keyer.chunk_tokens(); }
std::vector<std::string> KvStore::chunk_keys(std::span<const Token> tokens) const { return impl_->keyer.keys(tokens); }
storage::Client& KvStore::client() noexcept { return *impl_->client; }

Result<PutReport> KvStore::put(std::span<const Token> tokens, const KvView& kv, transport::Deadline deadline,
                               const PutOptions& options) {
  Impl& m = *impl_;
  if (!(kv.geometry() == m.profile.geometry()))
    return make_status(StatusCode::invalid_argument, "put: the KV's geometry is not the profile's");
  if (kv.first_position() != 0)
    return make_status(StatusCode::invalid_argument, "put: the KV must start at position 0 (it starts at {})",
                       kv.first_position());
  const auto keys = m.keyer.keys(tokens);
  const uint32_t ct = m.keyer.chunk_tokens();
  if (kv.tokens() < uint64_t(keys.size()) * ct)
    return make_status(StatusCode::invalid_argument, "put: {} whole chunks need {} tokens of KV, the view has {}",
                       keys.size(), uint64_t(keys.size()) * ct, kv.tokens());
  PutReport report;
  report.chunks = uint32_t(keys.size());
  KVS_ASSIGN_OR_RETURN(auto stored, m.stat_chunks(keys, /*all=*/true, deadline, options.cancel));
  // Objects this put writes (levels and a record per chunk not stored), and of them
  // written so far with their bytes: what is still to come when the storage is full.
  const uint32_t per_chunk = (m.profile.progressive() ? 1 : m.profile.levels()) + 1;
  uint64_t objects_left = 0, objects_done = 0, bytes_done = 0;
  for (uint32_t c = 0; c < keys.size(); ++c) objects_left += options.overwrite || stored[c].empty() ? per_chunk : 0;
  const std::unordered_set<std::string> own(keys.begin(), keys.end());
  // Stores one object. When the storage has no space and eviction.when_full is set,
  // older chunks make room for this object and the rest of the put (estimated from
  // those written so far), then it is tried again; each pass removes at least one
  // chunk, so it ends.
  auto store_object = [&](const std::function<Status()>& write, uint64_t object_bytes) -> Status {
    Status s = write();
    while (s.code() == StatusCode::no_space && m.cfg.eviction.when_full) {
      const uint64_t average = objects_done ? bytes_done / objects_done : object_bytes;
      const uint64_t want = object_bytes + average * (objects_left > 0 ? objects_left - 1 : 0);
      KVS_ASSIGN_OR_RETURN(const EvictReport ev,
                           store::make_room(m, want, m.cfg.eviction.when_full_fraction, own, deadline));
      if (ev.chunks_removed == 0) return s.with_context("nothing left to evict");
      report.evicted_chunks += ev.chunks_removed;
      report.evicted_bytes += ev.bytes_removed;
      s = write();
    }
    if (s.ok()) --objects_left, ++objects_done, bytes_done += object_bytes;
    return s;
  };
  std::vector<uint8_t> bytes;
  for (uint32_t c = 0; c < keys.size(); ++c) {
    if (!options.overwrite && !stored[c].empty()) {
      ++report.already_stored;
      continue;
    }
    KVS_ASSIGN_OR_RETURN(KvView chunk, kv.slice({uint64_t(c) * ct, uint64_t(c + 1) * ct}));
    // Replacing: the old chunk goes first, so that no reader pairs its record with
    // half-written new levels; the new record is written after every level.
    m.forget(keys[c]);
    if (!stored[c].empty()) (void)m.client->remove(keys[c], deadline, options.cancel);
    if (m.profile.progressive()) {
      // One stream holds every level; its parts are the levels' prefixes, coarsest
      // first, each with the encoder's measured distortion of that prefix.
      // The stored context's last tokens (those just before a runtime's new ones) are
      // coded finer when the profile has a recent window.
      bytes.clear();
      const codec::EncodeOptions eo{codec::recent_tokens_of(m.profile, {uint64_t(c) * ct, uint64_t(c + 1) * ct},
                                                            uint64_t(keys.size()) * ct)};
      KVS_RETURN_IF_ERROR(codec::encode_chunk(m.profile, chunk, 0, eo, bytes));
      KVS_ASSIGN_OR_RETURN(const std::vector<codec::ChunkPrefix> prefixes, codec::chunk_prefixes(bytes));
      std::vector<storage::ObjectPart> parts;
      for (const codec::ChunkPrefix& p : prefixes)
        if (p.whole_layer) parts.push_back({p.end, p.distortion});
      KVS_RETURN_IF_ERROR(store_object(
          [&] {
            return m.client->put_parts(keys[c], store::kLevelsChunk, 0, std::as_bytes(std::span(bytes)), parts, 0,
                                       deadline, options.cancel);
          },
          bytes.size()));
      report.bytes += bytes.size();
    }
    // Every level: the chooser picks among all of them per chunk, so each must be there.
    for (uint32_t l = 0; l < (m.profile.progressive() ? 0 : m.profile.levels()); ++l) {
      bytes.clear();
      KVS_RETURN_IF_ERROR(codec::encode_chunk(m.profile, chunk, l, bytes));
      KVS_RETURN_IF_ERROR(store_object(
          [&] {
            return m.client->put(keys[c], store::kLevelsChunk, l, std::as_bytes(std::span(bytes)), deadline,
                                 options.cancel);
          },
          bytes.size()));
      report.bytes += bytes.size();
    }
    store::ChunkRecord rec;
    rec.tokens = ct;
    rec.first_position = uint64_t(c) * ct;
    rec.stored_unix_ms = unix_ms_now();
    rec.levels = m.profile.levels();
    const auto record = store::serialize(rec);
    KVS_RETURN_IF_ERROR(store_object(
        [&] { return m.client->put(keys[c], store::kRecordChunk, 0, record, deadline, options.cancel); },
        record.size()));
  }
  report.tokens = uint64_t(keys.size()) * ct;
  // Stored or found stored, the prompt was seen now: all its chunks, one stamp.
  m.mark_used(keys, deadline);
  if (m.cfg.eviction.max_bytes > 0 || m.cfg.eviction.max_age.count() > 0) {
    auto ev = evict(m.cfg.eviction.max_bytes, m.cfg.eviction.max_age, deadline);
    if (!ev.ok()) KVS_LOG_WARN("kvstore: eviction after put failed: {}", ev.status().to_string());
  }
  return report;
}

Result<uint64_t> KvStore::lookup(std::span<const Token> tokens, transport::Deadline deadline,
                                 const transport::CancelToken& cancel) {
  KVS_ASSIGN_OR_RETURN(auto sizes, impl_->stat_chunks(impl_->keyer.keys(tokens), false, deadline, cancel));
  return uint64_t(sizes.size()) * impl_->keyer.chunk_tokens();
}

// ---- remove and evict ----------------------------------------------------------------

Result<uint32_t> KvStore::remove(std::span<const Token> tokens, transport::Deadline deadline) {
  uint32_t removed = 0;
  for (const auto& key : impl_->keyer.keys(tokens)) {
    impl_->forget(key);
    const Status st = impl_->client->remove(key, deadline);
    if (st.ok())
      ++removed;
    else if (st.code() != StatusCode::not_found)
      return st;
  }
  return removed;
}

Result<EvictReport> KvStore::evict(uint64_t max_bytes, std::chrono::seconds max_age, transport::Deadline deadline) {
  Impl& m = *impl_;
  KVS_ASSIGN_OR_RETURN(const auto chunks, store::chunks_in_eviction_order(m, deadline));
  uint64_t total = 0;
  for (const auto& c : chunks) total += c.bytes;
  const uint64_t now_us = unix_ms_now() * 1000;
  const uint64_t age_us = uint64_t(max_age.count()) * 1000000;
  EvictReport r;
  for (const auto& c : chunks) {
    const bool too_old = age_us > 0 && now_us > c.last_used_us + age_us;
    const bool over = max_bytes > 0 && total > max_bytes;
    if (!too_old && !over) continue;
    KVS_RETURN_IF_ERROR(store::remove_chunk(m, c, deadline));
    ++r.chunks_removed;
    r.bytes_removed += c.bytes;
    total -= c.bytes;
  }
  r.bytes_kept = total;
  if (r.chunks_removed)
    KVS_LOG_INFO("kvstore: evicted {} chunks ({} bytes); {} bytes kept", r.chunks_removed, r.bytes_removed, total);
  return r;
}

}  // namespace kvstream
