// RAII wrappers of device memory, page-locked memory, streams, events and graphs
// (gpu_resources.hpp). Each
// factory asks probe_device() first, so that without a GPU every one fails with the
// same clear reason (the CUDA error of the probe, logged once) instead of whatever
// the particular call would have said.
#include <utility>

#include "kvstream/gpu.hpp"
#include "kvstream/gpu_resources.hpp"

#if KVSTREAM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda_error.hpp"
#endif

namespace kvstream::gpu {

#if KVSTREAM_HAVE_CUDA

namespace {

// A usable GPU, and `device` selected on this thread (CUDA's current device is per
// thread, and streams, events and registrations belong to the current one).
Status use_device(int device) {
  KVS_ASSIGN_OR_RETURN(const DeviceInfo info, probe_device());
  (void)info;
  int count = 0;
  KVS_CUDA(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count)
    return make_status(StatusCode::unavailable, "GPU device {} does not exist ({} present)", device, count);
  KVS_CUDA(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
  return {};
}

}  // namespace

DeviceBuffer::~DeviceBuffer() {
  if (p_) {
    cudaSetDevice(device_);
    cudaFree(p_);
  }
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_), device_(o.device_) { o.p_ = nullptr, o.n_ = 0; }
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    DeviceBuffer old(std::move(*this));
    p_ = o.p_, n_ = o.n_, device_ = o.device_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}
Result<DeviceBuffer> DeviceBuffer::allocate(uint64_t bytes, int device) {
  KVS_RETURN_IF_ERROR(use_device(device));
  DeviceBuffer b;
  b.device_ = device;
  KVS_CUDA(cudaMalloc(&b.p_, std::max<uint64_t>(bytes, 1)), fmt::format("cudaMalloc of {} bytes", bytes));
  b.n_ = bytes;
  return b;
}

void PinnedHostMemory::reset() noexcept {
  if (p_) {
    if (registered_)
      cudaHostUnregister(p_);
    else
      cudaFreeHost(p_);
  }
  p_ = nullptr, n_ = 0, registered_ = false;
}

Result<PinnedHostMemory> PinnedHostMemory::allocate(size_t bytes) {
  KVS_ASSIGN_OR_RETURN(const DeviceInfo info, probe_device());
  (void)info;
  PinnedHostMemory m;
  // Portable: pinned for every device, not only the current one.
  KVS_CUDA(cudaHostAlloc(&m.p_, bytes ? bytes : 1, cudaHostAllocPortable),
           fmt::format("cudaHostAlloc of {} bytes", bytes));
  m.n_ = bytes;
  return m;
}

Result<PinnedHostMemory> PinnedHostMemory::register_range(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0)
    return make_status(StatusCode::invalid_argument, "cannot page-lock an empty range");
  KVS_ASSIGN_OR_RETURN(const DeviceInfo info, probe_device());
  (void)info;
  KVS_CUDA(cudaHostRegister(data, bytes, cudaHostRegisterPortable),
           fmt::format("cudaHostRegister of {} bytes", bytes));
  PinnedHostMemory m;
  m.p_ = data, m.n_ = bytes, m.registered_ = true;
  return m;
}

Result<Stream> Stream::create(int device) {
  KVS_RETURN_IF_ERROR(use_device(device));
  cudaStream_t s = nullptr;
  KVS_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  Stream r;
  r.s_ = s, r.device_ = device;
  return r;
}

Stream::~Stream() {
  if (s_) {
    cudaSetDevice(device_);
    cudaStreamDestroy(static_cast<cudaStream_t>(s_));
  }
}

Status Stream::synchronize() const {
  if (!s_) return make_status(StatusCode::invalid_argument, "synchronize on an empty Stream");
  KVS_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(s_)), "cudaStreamSynchronize");
  return {};
}

Result<Event> Event::create(int device, bool timing) {
  KVS_RETURN_IF_ERROR(use_device(device));
  cudaEvent_t e = nullptr;
  KVS_CUDA(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
           "cudaEventCreateWithFlags");
  Event r;
  r.e_ = e, r.device_ = device;
  return r;
}

Event::~Event() {
  if (e_) {
    cudaSetDevice(device_);
    cudaEventDestroy(static_cast<cudaEvent_t>(e_));
  }
}

Status Event::record(const Stream& stream) {
  if (!e_ || !stream.handle()) return make_status(StatusCode::invalid_argument, "record of an empty Event or Stream");
  KVS_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(e_), static_cast<cudaStream_t>(stream.handle())),
           "cudaEventRecord");
  return {};
}

Status Event::synchronize() const {
  if (!e_) return make_status(StatusCode::invalid_argument, "synchronize on an empty Event");
  KVS_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(e_)), "cudaEventSynchronize");
  return {};
}

Result<float> Event::elapsed_ms(const Event& start) const {
  if (!e_ || !start.e_) return make_status(StatusCode::invalid_argument, "elapsed_ms of an empty Event");
  float ms = 0;
  KVS_CUDA(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.e_), static_cast<cudaEvent_t>(e_)),
           "cudaEventElapsedTime");
  return ms;
}

Status copy_to_host(void* host_dst, const void* device_src, size_t bytes, int device) {
  KVS_RETURN_IF_ERROR(use_device(device));
  KVS_CUDA(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost),
           fmt::format("copy of {} bytes to the host", bytes));
  return {};
}

Status copy_to_device(void* device_dst, const void* host_src, size_t bytes, int device) {
  KVS_RETURN_IF_ERROR(use_device(device));
  KVS_CUDA(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice),
           fmt::format("copy of {} bytes to the device", bytes));
  return {};
}

Status check_device_pointer(const void* p, int device) {
  if (p == nullptr) return make_status(StatusCode::invalid_argument, "null device pointer");
  KVS_ASSIGN_OR_RETURN(const DeviceInfo info, probe_device());
  (void)info;
  cudaPointerAttributes a{};
  if (const cudaError_t e = cudaPointerGetAttributes(&a, p); e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so that the next call does not report it
    return detail::cuda_error(e, "cudaPointerGetAttributes");
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    return make_status(StatusCode::invalid_argument, "{} is not device memory (CUDA memory type {})", p, int(a.type));
  if (a.device != device)
    return make_status(StatusCode::invalid_argument, "{} is memory of GPU {}, not of GPU {}", p, a.device, device);
  return {};
}

Result<Graph> Graph::capture(const Stream& stream, const std::function<Status()>& work) {
  if (!stream.handle()) return make_status(StatusCode::invalid_argument, "graph capture on an empty Stream");
  KVS_RETURN_IF_ERROR(use_device(stream.device()));
  const auto s = static_cast<cudaStream_t>(stream.handle());
  KVS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  const Status st = work();
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(s, &g);  // always ends it, also after a failed `work`
  if (!st.ok()) {
    if (g) cudaGraphDestroy(g);
    return st;
  }
  if (e != cudaSuccess) return detail::cuda_error(e, "cudaStreamEndCapture");
  Graph r;
  r.graph_ = g, r.device_ = stream.device();
  cudaGraphExec_t x = nullptr;
  KVS_CUDA(cudaGraphInstantiate(&x, g, 0), "cudaGraphInstantiate");
  r.exec_ = x;
  return r;
}

Graph::~Graph() {
  if (!graph_) return;
  cudaSetDevice(device_);
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

Status Graph::launch(const Stream& stream) const {
  if (!exec_) return make_status(StatusCode::invalid_argument, "launch of an empty Graph");
  KVS_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream.handle())),
           "cudaGraphLaunch");
  return {};
}

#else  // !KVSTREAM_HAVE_CUDA

namespace {
Status no_cuda() { return make_status(StatusCode::unsupported, "kvstream was built without CUDA (KVSTREAM_WITH_CUDA)"); }
}  // namespace

DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_), device_(o.device_) { o.p_ = nullptr; }
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  p_ = o.p_, n_ = o.n_, device_ = o.device_, o.p_ = nullptr;
  return *this;
}
Result<DeviceBuffer> DeviceBuffer::allocate(uint64_t, int) { return no_cuda(); }
void PinnedHostMemory::reset() noexcept { p_ = nullptr, n_ = 0, registered_ = false; }
Result<PinnedHostMemory> PinnedHostMemory::allocate(size_t) { return no_cuda(); }
Result<PinnedHostMemory> PinnedHostMemory::register_range(void*, size_t) { return no_cuda(); }
Result<Stream> Stream::create(int) { return no_cuda(); }
Stream::~Stream() = default;
Status Stream::synchronize() const { return no_cuda(); }
Result<Event> Event::create(int, bool) { return no_cuda(); }
Event::~Event() = default;
Status Event::record(const Stream&) { return no_cuda(); }
Status Event::synchronize() const { return no_cuda(); }
Result<float> Event::elapsed_ms(const Event&) const { return no_cuda(); }
Status copy_to_host(void*, const void*, size_t, int) { return no_cuda(); }
Status copy_to_device(void*, const void*, size_t, int) { return no_cuda(); }
Status check_device_pointer(const void*, int) { return no_cuda(); }
Result<Graph> Graph::capture(const Stream&, const std::function<Status()>&) { return no_cuda(); }
Graph::~Graph() = default;
Status Graph::launch(const Stream&) const { return no_cuda(); }

#endif

// Moves: shared by both builds (no CUDA calls; the moved-from object owns nothing).
PinnedHostMemory::~PinnedHostMemory() { reset(); }
PinnedHostMemory::PinnedHostMemory(PinnedHostMemory&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), registered_(std::exchange(o.registered_, false)) {}
PinnedHostMemory& PinnedHostMemory::operator=(PinnedHostMemory&& o) noexcept {
  if (this != &o) {
    reset();
    p_ = std::exchange(o.p_, nullptr), n_ = std::exchange(o.n_, 0), registered_ = std::exchange(o.registered_, false);
  }
  return *this;
}
Stream::Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)), device_(o.device_) {}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    Stream old(std::move(*this));  // destroys what this held
    s_ = std::exchange(o.s_, nullptr), device_ = o.device_;
  }
  return *this;
}
Graph::Graph(Graph&& o) noexcept
    : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)), device_(o.device_) {}
Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    Graph old(std::move(*this));
    graph_ = std::exchange(o.graph_, nullptr), exec_ = std::exchange(o.exec_, nullptr), device_ = o.device_;
  }
  return *this;
}
Event::Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)), device_(o.device_) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Event old(std::move(*this));
    e_ = std::exchange(o.e_, nullptr), device_ = o.device_;
  }
  return *this;
}

}  // namespace kvstream::gpu
