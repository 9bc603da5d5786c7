// The streaming pipeline. A dispatcher thread per fetch walks the chunks in order:
// it asks the decision callback, takes a free receive buffer (back-pressure: at most
// `depth` chunks are on the wire or waiting to decode), and issues the get. When a
// chunk's bytes land, a decode worker decodes it straight from that buffer into the
// runtime's memory and returns the buffer. So chunk i+1.. travel while chunk i decodes.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/log.hpp"
#include "kvstream/pipeline.hpp"

namespace kvstream::pipeline {

namespace {

using namespace std::chrono_literals;

class PipelineImpl;

class FetchImpl final : public Fetch, public std::enable_shared_from_this<FetchImpl> {
 public:
  FetchImpl(PipelineImpl& p, FetchRequest req, FetchCallbacks cb, std::map<uint32_t, std::vector<uint64_t>> sizes)
      : p_(p), req_(std::move(req)), cb_(std::move(cb)), sizes_(std::move(sizes)) {
    timings_.resize(req_.chunks.size());
    for (uint32_t i = 0; i < timings_.size(); ++i) timings_[i].chunk = i;
    remaining_ = uint32_t(req_.chunks.size());
  }
  ~FetchImpl() override {
    // The last reference may be dropped on the dispatcher thread itself.
    if (dispatcher_.joinable()) {
      if (dispatcher_.get_id() == std::this_thread::get_id())
        dispatcher_.detach();
      else
        dispatcher_.join();
    }
  }

  void start() { dispatcher_ = std::thread([self = shared_from_this()] { self->dispatch(); }); }

  Status wait() override {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
    return first_error_;
  }
  void cancel() override { req_.cancel.cancel(); }
  std::vector<ChunkTimings> timings() const override {
    std::lock_guard lock(mu_);
    return timings_;
  }

  // Called by a decode worker: decode chunk i from its buffer, then finish it.
  void decode(uint32_t i, uint32_t buffer, size_t len);

 private:
  PipelineImpl& p_;
  FetchRequest req_;
  FetchCallbacks cb_;
  std::map<uint32_t, std::vector<uint64_t>> sizes_;
  std::thread dispatcher_;
  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  std::vector<ChunkTimings> timings_;
  uint32_t remaining_ = 0;
  Status first_error_;

  void dispatch();
  // Records the end of chunk i (with `st`), tells the runtime, wakes wait().
  void finish(uint32_t i, Status st);
  Status over() const {
    if (req_.cancel.cancelled()) return make_status(StatusCode::cancelled, "fetch of '{}' cancelled", req_.context);
    if (Clock::now() >= req_.deadline)
      return make_status(StatusCode::timed_out, "fetch of '{}' passed its deadline", req_.context);
    return {};
  }
};

class PipelineImpl final : public Pipeline {
 public:
  PipelineImpl(storage::Client& client, const codec::Profile& profile, const PipelineConfig& cfg)
      : client_(client), profile_(profile), cfg_(cfg) {}

  ~PipelineImpl() override {
    {
      std::lock_guard lock(jobs_mu_);
      stopping_ = true;
    }
    jobs_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  Status init() {
    if (cfg_.depth == 0 || cfg_.depth > 1024) return make_status(StatusCode::invalid_argument, "depth {}", cfg_.depth);
    if (cfg_.max_chunk_bytes == 0 || cfg_.max_chunk_bytes > storage::kMaxChunkBytes)
      return make_status(StatusCode::invalid_argument, "max_chunk_bytes {}", cfg_.max_chunk_bytes);
    if (cfg_.decode_threads == 0 || cfg_.decode_threads > 256)
      return make_status(StatusCode::invalid_argument, "decode_threads {}", cfg_.decode_threads);
    for (uint32_t b = 0; b < cfg_.depth; ++b) {
      // Pre-faulted once here, registered once, reused by every fetch.
      buffers_.emplace_back(cfg_.max_chunk_bytes, std::byte{0});
      KVS_ASSIGN_OR_RETURN(auto mr, client_.register_memory(buffers_.back().data(), buffers_.back().size()));
      regions_.push_back(std::move(mr));
      free_.push_back(b);
    }
    for (unsigned t = 0; t < cfg_.decode_threads; ++t) workers_.emplace_back([this] { work(); });
    return {};
  }

  Result<std::shared_ptr<Fetch>> fetch(FetchRequest req, FetchCallbacks cb) override {
    const KvGeometry& g = profile_.geometry();
    if (!(req.destination.geometry() == g))
      return make_status(StatusCode::invalid_argument, "destination geometry does not match the codec profile");
    for (size_t i = 0; i < req.chunks.size(); ++i)
      if (req.chunks[i].begin >= req.chunks[i].end || req.chunks[i].end > req.destination.tokens())
        return make_status(StatusCode::invalid_argument, "chunk {} range [{}, {}) outside the {}-token destination", i,
                           req.chunks[i].begin, req.chunks[i].end, req.destination.tokens());
    // The sizes of every level of every chunk, before anything is fetched.
    KVS_ASSIGN_OR_RETURN(auto stats, client_.stat(req.context, req.deadline, req.cancel));
    std::map<uint32_t, std::vector<uint64_t>> sizes;
    for (auto& s : stats) sizes[s.chunk] = std::move(s.level_bytes);
    auto f = std::make_shared<FetchImpl>(*this, std::move(req), std::move(cb), std::move(sizes));
    f->start();
    return std::shared_ptr<Fetch>(f);
  }

  uint32_t buffers_in_use() const override {
    std::lock_guard lock(free_mu_);
    return cfg_.depth - uint32_t(free_.size());
  }

  // Takes a free buffer, waiting while all are lent (back-pressure).
  Result<uint32_t> acquire(transport::Deadline deadline, const transport::CancelToken& cancel) {
    std::unique_lock lock(free_mu_);
    while (free_.empty()) {
      if (cancel.cancelled()) return make_status(StatusCode::cancelled, "cancelled while waiting for a buffer");
      if (Clock::now() >= deadline) return make_status(StatusCode::timed_out, "deadline passed waiting for a buffer");
      free_cv_.wait_for(lock, 5ms);
    }
    const uint32_t b = free_.front();
    free_.pop_front();
    return b;
  }
  void release(uint32_t b) {
    {
      std::lock_guard lock(free_mu_);
      free_.push_back(b);
    }
    free_cv_.notify_one();
  }
  void submit_decode(std::shared_ptr<FetchImpl> f, uint32_t chunk, uint32_t buffer, size_t len) {
    {
      std::lock_guard lock(jobs_mu_);
      jobs_.push_back({std::move(f), chunk, buffer, len});
    }
    jobs_cv_.notify_one();
  }

  storage::Client& client_;
  const codec::Profile& profile_;
  PipelineConfig cfg_;
  std::vector<std::vector<std::byte>> buffers_;
  std::vector<transport::MemoryRegion> regions_;

 private:
  struct Job {
    std::shared_ptr<FetchImpl> fetch;
    uint32_t chunk, buffer;
    size_t len;
  };
  mutable std::mutex free_mu_;
  std::condition_variable free_cv_;
  std::deque<uint32_t> free_;
  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;

  void work() {
    for (;;) {
      Job j;
      {
        std::unique_lock lock(jobs_mu_);
        jobs_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        j = std::move(jobs_.front());
        jobs_.pop_front();
      }
      j.fetch->decode(j.chunk, j.buffer, j.len);
    }
  }
};

void FetchImpl::dispatch() {
  for (uint32_t i = 0; i < req_.chunks.size(); ++i) {
    if (Status st = over(); !st.ok()) {
      finish(i, st);
      continue;
    }
    const auto it = sizes_.find(i);
    const std::span<const uint64_t> level_bytes =
        it == sizes_.end() ? std::span<const uint64_t>() : std::span<const uint64_t>(it->second);
    const ChunkDecision d = cb_.decide ? cb_.decide(i, level_bytes) : ChunkDecision{};
    {
      std::lock_guard lock(mu_);
      timings_[i].decision = d;
      timings_[i].queued = Clock::now();
    }
    if (d.action == ChunkDecision::Action::recompute) {
      finish(i, {});
      continue;
    }
    if (d.level >= level_bytes.size() || level_bytes[d.level] == 0) {
      finish(i, make_status(StatusCode::not_found, "chunk {} has no level {} stored", i, d.level));
      continue;
    }
    if (level_bytes[d.level] > p_.cfg_.max_chunk_bytes) {
      finish(i, make_status(StatusCode::resource_exhausted, "chunk {} level {} is {} bytes, buffers hold {}", i,
                            d.level, level_bytes[d.level], p_.cfg_.max_chunk_bytes));
      continue;
    }
    auto buffer = p_.acquire(req_.deadline, req_.cancel);
    if (!buffer.ok()) {
      finish(i, buffer.status());
      continue;
    }
    const uint32_t b = *buffer;
    {
      std::lock_guard lock(mu_);
      timings_[i].wire_start = Clock::now();
    }
    p_.client_.get_async(req_.context, i, d.level, p_.regions_[b], 0, p_.cfg_.max_chunk_bytes, req_.deadline,
                         req_.cancel, [self = shared_from_this(), i, b](Result<size_t> r) {
                           {
                             std::lock_guard lock(self->mu_);
                             self->timings_[i].wire_end = Clock::now();
                             if (r.ok()) self->timings_[i].bytes = *r;
                           }
                           if (!r.ok()) {
                             self->p_.release(b);
                             self->finish(i, r.status().with_context(fmt::format("chunk {}", i)));
                             return;
                           }
                           self->p_.submit_decode(self, i, b, *r);
                         });
  }
}

void FetchImpl::decode(uint32_t i, uint32_t buffer, size_t len) {
  thread_local codec::DecodeScratch scratch;  // one per decode worker, reused across chunks
  Status st = over();
  {
    std::lock_guard lock(mu_);
    timings_[i].decode_start = Clock::now();
  }
  if (st.ok()) {
    auto view = req_.destination.slice(req_.chunks[i]);
    st = view.ok() ? codec::decode_chunk(p_.profile_, std::span<const uint8_t>(
                                                          reinterpret_cast<const uint8_t*>(p_.buffers_[buffer].data()), len),
                                         *view, &scratch)
                   : view.status();
    if (st.ok()) {
      // The chunk's own header says which tokens it holds: they must be these.
      auto info = codec::inspect_chunk(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(p_.buffers_[buffer].data()), len));
      if (info.ok() && info->tokens != req_.chunks[i].size())
        st = make_status(StatusCode::corrupt_data, "chunk {} holds {} tokens, expected {}", i, info->tokens,
                         req_.chunks[i].size());
    }
  }
  {
    std::lock_guard lock(mu_);
    timings_[i].decode_end = Clock::now();
  }
  p_.release(buffer);
  finish(i, st.ok() ? st : st.with_context(fmt::format("chunk {}", i)));
}

void FetchImpl::finish(uint32_t i, Status st) {
  ChunkTimings t;
  {
    std::lock_guard lock(mu_);
    timings_[i].status = st;
    timings_[i].delivered = Clock::now();
    t = timings_[i];
  }
  if (cb_.on_chunk) cb_.on_chunk(t);
  {
    std::lock_guard lock(mu_);
    if (!st.ok() && first_error_.ok()) first_error_ = st;
    --remaining_;
  }
  done_cv_.notify_all();
}

}  // namespace

Result<std::unique_ptr<Pipeline>> Pipeline::create(storage::Client& client, const codec::Profile& profile,
                                                   const PipelineConfig& config) {
  auto p = std::make_unique<PipelineImpl>(client, profile, config);
  KVS_RETURN_IF_ERROR(p->init());
  return std::unique_ptr<Pipeline>(std::move(p));
}

}  // namespace kvstream::pipeline
