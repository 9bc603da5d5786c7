// The pipeline's GPU path (pipeline_impl.hpp): where decode runs (decode=auto takes
// the CPU when no GPU decoder can start, and says why), the GPU workers' decoders,
// streams and page-locked buffers, GPUDirect's device receive buffers, and the checks
// of a destination in device memory.
#include <fmt/ranges.h>

#include "core/log.hpp"
#include "pipeline/pipeline_impl.hpp"

namespace kvstream::pipeline::detail {

Status PipelineImpl::check_gpudirect() const {
  if (cfg_.decode == DecodeOn::cpu)
    return make_status(StatusCode::invalid_argument,
                       "GPUDirect lands chunks in device memory, which decode=cpu cannot read; use decode=gpu");
  const transport::Capabilities* caps = client_.capabilities();
  if (caps == nullptr)
    return make_status(StatusCode::unsupported,
                       "GPUDirect: the storage client does not report its transport backend's capabilities, so it "
                       "lands chunks in host memory only (none of the backends built here, {}, declares "
                       "Capabilities::cuda_memory); use the pinned host path (gpudirect = false)",
                       fmt::join(transport::available_backends(), ", "));
  if (!caps->cuda_memory)
    return make_status(StatusCode::unsupported,
                       "GPUDirect: transport backend '{}' ({}) cannot land chunks in GPU memory "
                       "(Capabilities::cuda_memory is false); use the pinned host path (gpudirect = false)",
                       caps->backend, caps->provider);
  return {};
}

Status PipelineImpl::start_gpudirect() {
  if (decodes_on_ != DecodeOn::gpu)
    return make_status(StatusCode::unavailable, "GPUDirect needs the GPU decode path, and decode=auto took the CPU: {}",
                       cpu_reason_);
  for (uint32_t b = 0; b < cfg_.depth; ++b) {
    KVS_ASSIGN_OR_RETURN(auto d, gpu::DeviceBuffer::allocate(cfg_.max_chunk_bytes, cfg_.gpu_device));
    device_buffers_.push_back(std::move(d));
    auto mr = client_.register_memory(device_buffers_.back().data(), cfg_.max_chunk_bytes, transport::MemoryType::cuda);
    if (!mr.ok()) return mr.status().with_context("GPUDirect: registering a device receive buffer");
    if (mr->type() != transport::MemoryType::cuda)
      return make_status(StatusCode::internal, "GPUDirect: the client registered device memory as {}",
                         transport::memory_type_name(mr->type()));
    regions_.push_back(std::move(mr).value());
  }
  KVS_LOG_INFO("pipeline: GPUDirect: {} device receive buffers of {} bytes registered with backend '{}'", cfg_.depth,
               cfg_.max_chunk_bytes, client_.capabilities()->backend);
  return {};
}

Status PipelineImpl::choose_decode() {
  if (cfg_.decode == DecodeOn::cpu) {
    KVS_LOG_INFO("pipeline: decoding on the CPU ({} threads, {} buffers of {} bytes)", cfg_.decode_threads,
                 cfg_.depth, cfg_.max_chunk_bytes);
    return {};
  }
  Status st = start_gpu();
  if (st.ok()) {
    decodes_on_ = DecodeOn::gpu;
    const auto info = gpu::probe_device();
    KVS_LOG_INFO("pipeline: decoding on GPU {} ({}): {} decoders with a stream each, {} page-locked buffers of {} "
                 "bytes",
                 cfg_.gpu_device, info.ok() ? info->name : "?", cfg_.decode_threads, cfg_.depth,
                 cfg_.max_chunk_bytes);
    return {};
  }
  gpu_workers_.clear();
  pinned_.clear();
  if (cfg_.decode == DecodeOn::gpu) return st.with_context("pipeline decode=gpu");
  // automatic: the CPU. When no GPU is usable at all, gpu::probe_device() has said
  // why once per process (the CUDA error, "using the CPU path"), so this line does
  // not repeat it on every create; other reasons (a decoder that cannot start) are
  // said here.
  cpu_reason_ = st.message();
  if (gpu::probe_device().ok())
    KVS_LOG_WARN("pipeline: decode=auto: decoding on the CPU ({} threads) because {}", cfg_.decode_threads,
                 cpu_reason_);
  else
    KVS_LOG_INFO("pipeline: decoding on the CPU ({} threads, decode=auto: no usable GPU)", cfg_.decode_threads);
  return {};
}

Status PipelineImpl::start_gpu() {
  KVS_ASSIGN_OR_RETURN(const gpu::DeviceInfo info, gpu::probe_device());
  (void)info;
  for (unsigned t = 0; t < cfg_.decode_threads; ++t) {
    GpuWorker w;
    KVS_ASSIGN_OR_RETURN(w.decoder, gpu::GpuDecoder::create(profile_, cfg_.gpu_device));
    KVS_ASSIGN_OR_RETURN(w.stream, gpu::Stream::create(cfg_.gpu_device));
    gpu_workers_.push_back(std::move(w));
  }
  for (auto& b : buffers_) {
    KVS_ASSIGN_OR_RETURN(auto pin, gpu::PinnedHostMemory::register_range(b.data(), b.size()));
    pinned_.push_back(std::move(pin));
  }
  return {};
}

Status PipelineImpl::check_device_destination(const FetchRequest& req) const {
  if (decodes_on_ != DecodeOn::gpu)
    return make_status(StatusCode::invalid_argument, "a device destination needs a GPU pipeline; this one decodes "
                                                     "on the CPU{}",
                       cpu_reason_.empty() ? "" : " (decode=auto: " + cpu_reason_ + ")");
  const DeviceDestination& d = req.device;
  if (d.chunks.size() != req.chunks.size())
    return make_status(StatusCode::invalid_argument, "device destination has {} chunk pointers for {} chunks",
                       d.chunks.size(), req.chunks.size());
  if (d.dtype != DType::f16 && d.dtype != DType::bf16 && d.dtype != DType::f32)
    return make_status(StatusCode::invalid_argument, "device destination element type {} (f16, bf16 or f32)",
                       int(d.dtype));
  for (size_t i = 0; i < req.chunks.size(); ++i) {
    if (req.chunks[i].begin >= req.chunks[i].end)
      return make_status(StatusCode::invalid_argument, "chunk {} range [{}, {}) is empty", i, req.chunks[i].begin,
                         req.chunks[i].end);
    if (Status st = gpu::check_device_pointer(d.chunks[i], cfg_.gpu_device); !st.ok())
      return make_status(StatusCode::invalid_argument, "device destination of chunk {}: {}", i, st.message());
  }
  return {};
}

Status PipelineImpl::check_device_view(const FetchRequest& req) const {
  if (decodes_on_ != DecodeOn::gpu)
    return make_status(StatusCode::invalid_argument, "a destination in device memory needs a GPU pipeline; this one "
                                                     "decodes on the CPU");
  const KvView& v = req.destination;
  if (v.tokens() == 0) return make_status(StatusCode::invalid_argument, "device destination view is empty");
  for (uint32_t l = 0; l < v.geometry().layers; ++l)
    for (uint32_t pl = 0; pl < v.geometry().planes(); ++pl)
      if (Status st = gpu::check_device_pointer(v.row(l, pl, 0), cfg_.gpu_device); !st.ok())
        return make_status(StatusCode::invalid_argument, "device destination view, layer {} plane {}: {}", l, pl,
                           st.message());
  return {};
}

}  // namespace kvstream::pipeline::detail
