// One fetch of the pipeline (pipeline_impl.hpp): its dispatcher, which decides each
// chunk as late as it can and issues its get, and the decode of each chunk that landed
// (on the CPU, or on a GPU worker's stream), then its end told to the runtime.
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/log.hpp"
#include "pipeline/pipeline_impl.hpp"

namespace kvstream::pipeline::detail {

using namespace std::chrono_literals;

void FetchImpl::dispatch() {
  // Each chunk is decided as late as it can be: once a receive buffer is free and fewer
  // than max_on_wire transfers are outstanding. A decision made earlier would use an
  // older throughput estimate and could not follow a change of the link. A chunk
  // decided as text gives its buffer to the next one.
  std::optional<uint32_t> held;
  const uint32_t max_on_wire = p_.cfg_.max_on_wire ? p_.cfg_.max_on_wire : p_.cfg_.depth;
  // Ends chunk i here (text, an error, the fetch over). The last chunk first gives back
  // a buffer no later chunk will take: its finish may end the fetch, and a fetch that
  // has ended holds no buffer (buffers_in_use() is 0 once every wait() returned).
  auto end_here = [&](uint32_t i, Status st) {
    if (held && i + 1 == req_.chunks.size()) {
      p_.release(*held);
      held.reset();
    }
    finish(i, std::move(st));
  };
  for (uint32_t i = 0; i < req_.chunks.size(); ++i) {
    if (Status st = over(); !st.ok()) {
      end_here(i, st);
      continue;
    }
    if (!held) {
      auto buffer = p_.acquire(req_.deadline, req_.cancel);
      if (!buffer.ok()) {
        end_here(i, buffer.status());
        continue;
      }
      held = *buffer;
    }
    if (Status st = wait_on_wire_below(max_on_wire); !st.ok()) {
      end_here(i, st);
      continue;
    }
    const uint32_t stored = stored_chunk(req_, i);
    const std::span<const uint64_t> level_bytes(sizes_[i]);
    const ChunkDecision d = cb_.decide ? cb_.decide(i, level_bytes) : ChunkDecision{};
    {
      std::lock_guard lock(mu_);
      timings_[i].decision = d;
      timings_[i].queued = Clock::now();
    }
    if (d.action == ChunkDecision::Action::recompute) {
      end_here(i, {});
      continue;
    }
    if (d.level >= level_bytes.size() || level_bytes[d.level] == 0) {
      end_here(i, make_status(StatusCode::not_found, "chunk {} has no level {} stored", i, d.level));
      continue;
    }
    if (level_bytes[d.level] > p_.cfg_.max_chunk_bytes) {
      end_here(i, make_status(StatusCode::resource_exhausted, "chunk {} level {} is {} bytes, buffers hold {}", i,
                              d.level, level_bytes[d.level], p_.cfg_.max_chunk_bytes));
      continue;
    }
    const uint32_t b = *held;
    held.reset();
    {
      std::lock_guard lock(mu_);
      timings_[i].wire_start = Clock::now();
      ++on_wire_;
    }
    auto landed = [self = shared_from_this(), i, b](Result<size_t> r) {
      {
        std::lock_guard lock(self->mu_);
        self->timings_[i].wire_end = Clock::now();
        if (r.ok()) self->timings_[i].bytes = *r;
        --self->on_wire_;
      }
      self->on_wire_cv_.notify_all();
      if (!r.ok()) {
        self->p_.release(b);
        self->finish(i, r.status().with_context(fmt::format("chunk {}", i)));
        return;
      }
      self->p_.submit_decode(self, i, b, *r);
    };
    // A progressive chunk is one object: the level is the prefix of its size.
    if (p_.profile_.progressive())
      p_.client_.get_range_async(stored_context(req_, i), stored, 0, 0, level_bytes[d.level], p_.regions_[b], 0,
                                 req_.deadline, req_.cancel, std::move(landed));
    else
      p_.client_.get_async(stored_context(req_, i), stored, d.level, p_.regions_[b], 0, p_.cfg_.max_chunk_bytes,
                           req_.deadline, req_.cancel, std::move(landed));
  }
  if (held) p_.release(*held);
}

Status FetchImpl::wait_on_wire_below(uint32_t limit) {
  std::unique_lock lock(mu_);
  while (on_wire_ >= limit) {
    if (Status st = over(); !st.ok()) return st;
    on_wire_cv_.wait_for(lock, 5ms);
  }
  return {};
}

void FetchImpl::decode(uint32_t i, uint32_t buffer, size_t len, GpuWorker* gpu) {
  Status st = over();
  {
    std::lock_guard lock(mu_);
    timings_[i].decode_start = Clock::now();
  }
  if (st.ok()) {
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(p_.buffers_[buffer].data()), len);
    const void* landed = nullptr;
    if (!p_.device_buffers_.empty()) {
      // GPUDirect: the chunk is in device memory; its host copy is what the decoder
      // checks (header, checksums, framing) before decoding it where it lies.
      landed = p_.device_buffers_[buffer].data();
      st = gpu::copy_to_host(p_.buffers_[buffer].data(), landed, len, p_.cfg_.gpu_device);
    }
    if (st.ok()) st = gpu ? decode_gpu(i, bytes, *gpu, landed) : decode_cpu(i, bytes);
    if (st.ok() && req_.keep_bytes) {
      std::vector<uint8_t> copy(bytes.begin(), bytes.end());
      std::lock_guard lock(mu_);
      kept_.resize(req_.chunks.size());
      kept_[i] = std::move(copy);
    }
  }
  {
    std::lock_guard lock(mu_);
    timings_[i].decode_end = Clock::now();
  }
  // After decode_gpu returned, the worker's stream is idle: the upload from this
  // buffer is complete, so it may take the next chunk.
  p_.release(buffer);
  finish(i, st.ok() ? st : st.with_context(fmt::format("chunk {}", i)));
}

Status FetchImpl::decode_cpu(uint32_t i, std::span<const uint8_t> bytes) {
  thread_local codec::DecodeScratch scratch;  // one per decode worker, reused across chunks
  auto view = req_.destination.slice(req_.chunks[i]);
  if (!view.ok()) return view.status();
  KVS_RETURN_IF_ERROR(codec::decode_chunk(p_.profile_, bytes, *view, &scratch));
  // The chunk's own header says which tokens it holds: they must be these.
  auto info = codec::inspect_chunk(bytes);
  if (info.ok() && info->tokens != req_.chunks[i].size())
    return make_status(StatusCode::corrupt_data, "chunk {} holds {} tokens, expected {}", i, info->tokens,
                       req_.chunks[i].size());
  return {};
}

Status FetchImpl::decode_gpu(uint32_t i, std::span<const uint8_t> bytes, GpuWorker& gpu, const void* landed) {
  // Checked before decoding here: the GPU writes as many tokens as the chunk holds, and
  // the runtime's device memory for chunk i holds exactly the range's tokens.
  KVS_ASSIGN_OR_RETURN(const codec::ChunkInfo info, codec::inspect_chunk(bytes));
  if (info.tokens != req_.chunks[i].size())
    return make_status(StatusCode::corrupt_data, "chunk {} holds {} tokens, expected {}", i, info.tokens,
                       req_.chunks[i].size());
  auto to_device = [&](const KvView& view) {
    return landed ? gpu.decoder->decode_landed(bytes, landed, view, gpu.stream.handle())
                  : gpu.decoder->decode(bytes, view, gpu.stream.handle());
  };
  if (!req_.device.empty()) {
    KVS_ASSIGN_OR_RETURN(const KvView packed, KvView::packed(req_.device.chunks[i], req_.device.dtype,
                                                             p_.profile_.geometry(), req_.chunks[i].size(),
                                                             info.first_position));
    return to_device(packed);
  }
  auto view = req_.destination.slice(req_.chunks[i]);
  if (!view.ok()) return view.status();
  if (req_.destination_memory == transport::MemoryType::cuda) return to_device(*view);
  return gpu.decoder->decode_to_host(bytes, *view);
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

}  // namespace kvstream::pipeline::detail
