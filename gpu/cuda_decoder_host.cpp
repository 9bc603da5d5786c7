// Host side of the GPU chunk decoder: parsing and checking (the CPU decoder's rules),
// device memory, uploads, launches and the error read-back. Kernels: cuda_decoder.cu.
#include <cmath>
#include <cstring>
#include <mutex>

#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"

#if KVSTREAM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "codec/bitstream.hpp"
#include "codec/chunk_plan.hpp"
#include "codec/profile_impl.hpp"
#include "gpu/cuda_kernels.hpp"
#include "codec/impl_access.hpp"
#endif

namespace kvstream::gpu {

uint64_t GpuDecoder::output_bytes(const KvGeometry& g, uint64_t tokens, DType dtype) noexcept {
  return g.elements_per_token() * tokens * dtype_size(dtype);
}

#if KVSTREAM_HAVE_CUDA

namespace {

using codec::Profile;
using codec::ProfileAccess;
static_assert(detail::kProbBits == codec::PROB_BITS && detail::kLanes == codec::RANS_LANES);

Status cuda_error(cudaError_t e, std::string_view what) {
  const StatusCode code =
      e == cudaErrorMemoryAllocation ? StatusCode::resource_exhausted : StatusCode::unavailable;
  return make_status(code, "{}: CUDA error {} ({}): {}", what, int(e), cudaGetErrorName(e), cudaGetErrorString(e));
}
#define KVS_CUDA(expr, what)                                          \
  do {                                                                \
    if (const cudaError_t kvs_e_ = (expr); kvs_e_ != cudaSuccess)     \
      return cuda_error(kvs_e_, what);                                \
  } while (0)

// Device memory that grows on demand (contents are not kept across growth), over the
// public DeviceBuffer, on the calling thread's current device (the decoder selects it).
class DevBuf {
 public:
  Status reserve(size_t n, std::string_view what) {
    if (n <= buf_.size() && buf_.data()) return {};
    int device = 0;
    KVS_CUDA(cudaGetDevice(&device), "cudaGetDevice");
    buf_ = DeviceBuffer();  // free before allocating the larger one
    auto b = DeviceBuffer::allocate(std::max<size_t>(n, 256), device);
    if (!b.ok()) return b.status().with_context(fmt::format("device memory for {}", what));
    buf_ = std::move(b).value();
    return {};
  }
  Status upload(const void* src, size_t n, std::string_view what) {
    KVS_RETURN_IF_ERROR(reserve(n, what));
    if (n) KVS_CUDA(cudaMemcpy(buf_.data(), src, n, cudaMemcpyHostToDevice), fmt::format("upload of {}", what));
    return {};
  }
  template <typename T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(buf_.data());
  }

 private:
  DeviceBuffer buf_;
};

// Page-locked host memory (fast, truly asynchronous copies) that grows on demand, over
// the public PinnedHostMemory.
class PinnedBuf {
 public:
  Status reserve(size_t n) {
    if (n <= mem_.size() && mem_.data()) return {};
    const size_t want = std::max<size_t>(n + n / 4, 4096);  // some headroom: chunks vary in size
    mem_ = PinnedHostMemory();
    KVS_ASSIGN_OR_RETURN(mem_, PinnedHostMemory::allocate(want));
    return {};
  }
  [[nodiscard]] uint8_t* data() const noexcept { return static_cast<uint8_t*>(mem_.data()); }

 private:
  PinnedHostMemory mem_;
};

cudaStream_t cuda_stream(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }
cudaEvent_t cuda_event(const Event& e) { return static_cast<cudaEvent_t>(e.handle()); }

// Milliseconds between two reached events; 0 when CUDA cannot tell (timings only).
float elapsed(const Event& a, const Event& b) {
  auto ms = b.elapsed_ms(a);
  return ms.ok() ? *ms : 0.0f;
}

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// True when `p` lies in page-locked host memory (cudaHostAlloc, or a range that
// cudaHostRegister covers), from which an upload is DMA without a staging copy.
bool page_locked(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // not sticky; cleared so that the next call does not see it
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}
inline uint32_t rd_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian hosts only, as the CPU codec
  return v;
}

struct LevelState {
  bool loaded = false;
  DevBuf dec, table_of;
};

}  // namespace

struct GpuDecoder::Impl {
  Profile profile;
  int device = 0;
  std::mutex mu;
  // Profile constants.
  DevBuf mean, step_scale, predictor, transform_t;
  std::vector<uint64_t> ut_off;  // per (layer, plane)
  std::vector<LevelState> levels;
  // Per-chunk buffers, reused.
  PinnedBuf stage;     // [chunk bytes unless page-locked] + descriptors + lists, one H2D copy
  DevBuf upload;       // device copy of `stage`
  DevBuf syms, out_host_path;
  DevBuf rope_ec, rope_es, rope_partner;
  DevBuf mat_err;
  PinnedBuf err_host;
  Stream own_stream;
  Event ev[4];
  DecodeTimings timings;
  // RoPE tables of the last chunk (rebuilt when first position or token count change).
  codec::RopeTable rope;
  bool rope_valid = false;
  uint64_t rope_first = 0;
  uint32_t rope_tokens = 0;
  // Host scratch.
  std::vector<detail::MatDesc> mats;
  std::vector<detail::PlaneDesc> planes;
  std::vector<uint32_t> list_index;
  std::vector<float> list_value;
  std::vector<std::string> mat_where;

  Status init();
  Status ensure_level(uint32_t level);
  Status parse(std::span<const uint8_t> bytes, codec::ChunkHeader& h, size_t& payload_off);
  Status decode(std::span<const uint8_t> chunk, void* out, uint64_t out_bytes, DType dtype, cudaStream_t stream);
};

Status GpuDecoder::Impl::init() {
  const Profile::Impl& p = ProfileAccess::of(profile);
  KVS_CUDA(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
  int optin = 0;
  KVS_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  const size_t shared = detail::reconstruct_shared_bytes(p.geom.channels());
  if (shared > size_t(optin))
    return make_status(StatusCode::unsupported,
                       "GPU decoder: {} channels per token need {} bytes of shared memory, the device has {}",
                       p.geom.channels(), shared, optin);
  if (const int e = detail::prepare_reconstruct(shared); e != 0)
    return cuda_error(cudaError_t(e), "cudaFuncSetAttribute");
  KVS_RETURN_IF_ERROR(mean.upload(p.mean.data(), p.mean.size() * 4, "profile means"));
  KVS_RETURN_IF_ERROR(step_scale.upload(p.step_scale.data(), p.step_scale.size() * 4, "profile step scales"));
  KVS_RETURN_IF_ERROR(predictor.upload(p.predictor.data(), p.predictor.size(), "profile predictors"));
  std::vector<float> ut;
  const uint32_t n_lp = p.geom.layers * p.geom.planes();
  ut_off.assign(n_lp, 0);
  for (uint32_t lp = 0; lp < n_lp; ++lp) {
    ut_off[lp] = ut.size();
    if (p.block_of(lp)) ut.insert(ut.end(), p.transform_t[lp].begin(), p.transform_t[lp].end());
  }
  KVS_RETURN_IF_ERROR(transform_t.upload(ut.data(), ut.size() * 4, "profile transforms"));
  levels = std::vector<LevelState>(p.levels.size());
  KVS_ASSIGN_OR_RETURN(own_stream, Stream::create(device));
  for (Event& e : ev) {
    KVS_ASSIGN_OR_RETURN(e, Event::create(device));
  }
  KVS_RETURN_IF_ERROR(err_host.reserve(4 * n_lp * 2));
  return {};
}

Status GpuDecoder::Impl::ensure_level(uint32_t level) {
  LevelState& ls = levels[level];
  if (ls.loaded) return {};
  const Profile::Impl::Level& lv = ProfileAccess::of(profile).levels[level];
  KVS_RETURN_IF_ERROR(ls.dec.upload(lv.rans->decode_table(), lv.rans->size() * codec::PROB_SCALE * 4,
                                    "rANS decode tables"));
  std::vector<uint8_t> tof(lv.table_of[codec::kRolePlain]);
  tof.insert(tof.end(), lv.table_of[codec::kRoleAnchor].begin(), lv.table_of[codec::kRoleAnchor].end());
  KVS_RETURN_IF_ERROR(ls.table_of.upload(tof.data(), tof.size(), "table ids"));
  ls.loaded = true;
  return {};
}

// Header, profile and payload checks of open_chunk(), then each substream with the
// checks of decode_matrix() and of rans_decode() that need no decoding. Fills the
// matrix and plane descriptors (offsets relative to the chunk's first byte).
Status GpuDecoder::Impl::parse(std::span<const uint8_t> bytes, codec::ChunkHeader& h, size_t& off) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  KVS_ASSIGN_OR_RETURN(h, codec::parse_header_for(profile, bytes, &off));
  KVS_RETURN_IF_ERROR(codec::verify_payload(bytes, off));

  const uint32_t C = p.geom.channels(), T = h.info.tokens, G = p.group_size, P = p.geom.planes();
  const uint64_t TC = uint64_t(T) * C;
  const uint32_t level = h.info.level;
  const codec::RansTables& tables = *p.levels[level].rans;
  const size_t ch_total = p.channels_total();
  mats.clear(), planes.clear(), list_index.clear(), list_value.clear(), mat_where.clear();
  uint64_t sym_off = 0;
  size_t sub_off = off;
  for (uint32_t l = 0; l < p.geom.layers; ++l)
    for (uint32_t pl = 0; pl < P; ++pl) {
      const size_t si = size_t(l) * P + pl;
      const uint8_t* sub = bytes.data() + sub_off;
      const size_t sub_len = h.substream_bytes[si];
      const size_t sub_base = sub_off;
      sub_off += sub_len;
      auto where = [&] { return fmt::format("layer {} plane {}", l, pl); };
      const uint32_t block = p.block_of(si);
      const bool has_anchor = block == 0 && p.has_anchor(l, pl);
      const uint32_t n_anchor_rows = has_anchor ? (T + G - 1) / G : 0;
      const uint32_t n_plain_rows = T - n_anchor_rows;

      detail::PlaneDesc pd{};
      pd.chan_off = p.idx(l, pl, 0);
      pd.ut_off = ut_off[si];
      pd.block = block;
      pd.has_anchor = has_anchor;
      pd.rotate = codec::unrotates(p, pl);
      pd.plane_index = uint32_t(si);

      size_t pos = 0;
      auto read_list = [&](uint32_t& begin, uint32_t& count) -> Status {
        const bool ok = pos + 4 <= sub_len;
        const uint32_t n = ok ? rd_u32(sub + pos) : 0;
        if (ok) pos += 4;
        if (!ok || uint64_t(n) > TC || uint64_t(n) * 8 > sub_len - pos)
          return make_status(StatusCode::corrupt_data, "{}: bad outlier count", where());
        begin = uint32_t(list_index.size()), count = n;
        for (uint32_t i = 0; i < n; ++i, pos += 8) {
          const uint32_t idx = rd_u32(sub + pos);
          float v;
          std::memcpy(&v, sub + pos + 4, 4);
          if (uint64_t(idx) >= TC || (i > 0 && idx <= list_index.back()) || !std::isfinite(v))
            return make_status(StatusCode::corrupt_data, "{}: bad outlier {}", where(), i);
          list_index.push_back(idx);
          list_value.push_back(v);
        }
        return {};
      };
      KVS_RETURN_IF_ERROR(read_list(pd.out_begin, pd.out_count));
      KVS_RETURN_IF_ERROR(read_list(pd.exact_begin, pd.exact_count));
      if (pd.exact_count && !block)
        return make_status(StatusCode::corrupt_data, "{}: exact values on a plane without a transform", where());

      auto add_matrix = [&](uint32_t rows, int role, const char* what, uint64_t& sym_at) -> Status {
        std::span<const uint8_t> rest(sub + pos, sub_len - pos);
        KVS_ASSIGN_OR_RETURN(size_t len, codec::rans_coded_size(rest));
        if (len > rest.size()) return make_status(StatusCode::corrupt_data, "{}: truncated {}", where(), what);
        const uint8_t* tid = p.levels[level].table_of[role].data() + pd.chan_off;
        for (uint32_t c = 0; c < C; ++c)
          if (tid[c] >= tables.size())
            return make_status(StatusCode::invalid_argument, "{}: column {} uses table {} of {}", where(), c, tid[c],
                               tables.size());
        if (rows > std::numeric_limits<uint32_t>::max() / C)
          return make_status(StatusCode::out_of_range, "{}: {} x {} symbols exceed 2^32 - 1", where(), rows, C);
        const uint64_t n = uint64_t(rows) * C;
        detail::MatDesc m{};
        m.n_words = rd_u32(rest.data() + 4);
        m.n_escapes = rd_u32(rest.data() + 8);
        if (m.n_words > n || m.n_escapes > n)
          return make_status(StatusCode::corrupt_data, "{}: rans: {} words / {} escapes for {} symbols", where(),
                             m.n_words, m.n_escapes, n);
        m.words_off = sub_base + pos + 12;
        m.escapes_off = m.words_off + 2 * uint64_t(m.n_words);
        const uint8_t* st = rest.data() + 12 + 2 * size_t(m.n_words) + m.n_escapes;
        for (int k = 0; k < detail::kLanes; ++k) {
          m.state[k] = rd_u32(st + 4 * k);
          if (m.state[k] < (1u << 16))
            return make_status(StatusCode::corrupt_data, "{}: rans: lane {} start state too low", where(), k);
        }
        m.sym_off = sym_at = sym_off;
        sym_off += n;
        m.table_of_off = uint64_t(role) * ch_total + pd.chan_off;
        m.rows = rows;
        m.cols = C;
        mats.push_back(m);
        mat_where.push_back(where());
        pos += len;
        return {};
      };
      if (n_plain_rows) KVS_RETURN_IF_ERROR(add_matrix(n_plain_rows, codec::kRolePlain, "symbols", pd.plain_sym_off));
      if (n_anchor_rows)
        KVS_RETURN_IF_ERROR(add_matrix(n_anchor_rows, codec::kRoleAnchor, "anchors", pd.anchor_sym_off));
      if (pos != sub_len)
        return make_status(StatusCode::corrupt_data, "{}: {} trailing bytes", where(), sub_len - pos);
      planes.push_back(pd);
    }
  return {};
}

Status GpuDecoder::Impl::decode(std::span<const uint8_t> chunk, void* out, uint64_t out_bytes, DType dtype,
                                cudaStream_t stream) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    return make_status(StatusCode::invalid_argument, "unknown output element type {}", int(dtype));
  KVS_CUDA(cudaSetDevice(device), "cudaSetDevice");
  codec::ChunkHeader h;
  size_t payload_off = 0;
  KVS_RETURN_IF_ERROR(parse(chunk, h, payload_off));
  const uint32_t T = h.info.tokens, C = p.geom.channels();
  const uint64_t need = output_bytes(p.geom, T, dtype);
  if (out == nullptr || out_bytes < need)
    return make_status(StatusCode::invalid_argument, "GPU decode needs {} bytes of output, got {}", need,
                       out == nullptr ? 0 : out_bytes);
  KVS_RETURN_IF_ERROR(ensure_level(h.info.level));

  // RoPE tables: the CPU's code, built on the host, uploaded when they change.
  const bool rotate = codec::unrotates(p, 0);
  if (rotate && (!rope_valid || rope_first != h.info.first_position || rope_tokens != T)) {
    rope_valid = false;
    rope.build(p.rope, p.geom.head_dim, h.info.first_position, T);
    KVS_RETURN_IF_ERROR(rope_ec.upload(rope.ec.data(), rope.ec.size() * 4, "RoPE cosines"));
    KVS_RETURN_IF_ERROR(rope_es.upload(rope.es.data(), rope.es.size() * 4, "RoPE sines"));
    KVS_RETURN_IF_ERROR(rope_partner.upload(rope.partner.data(), rope.partner.size() * 4, "RoPE partners"));
    rope_valid = true, rope_first = h.info.first_position, rope_tokens = T;
  }

  // One device upload area: chunk | mats | planes | list index | list value. When the
  // chunk already lies in page-locked memory (the pipeline's registered receive
  // buffers), it is copied from there by DMA and only the descriptors go through the
  // staging buffer; otherwise everything is staged and sent in one copy.
  const bool direct = page_locked(chunk.data());
  const size_t o_mats = align_up(chunk.size(), 16);
  const size_t o_planes = align_up(o_mats + mats.size() * sizeof(detail::MatDesc), 16);
  const size_t o_idx = align_up(o_planes + planes.size() * sizeof(detail::PlaneDesc), 16);
  const size_t o_val = align_up(o_idx + list_index.size() * 4, 16);
  const size_t total = align_up(o_val + list_value.size() * 4, 16);
  const size_t base = direct ? o_mats : 0;  // stage holds [base, total) of the area
  KVS_RETURN_IF_ERROR(stage.reserve(total - base));
  KVS_RETURN_IF_ERROR(upload.reserve(total, "chunk upload"));
  auto st = [&](size_t area_off) { return stage.data() + (area_off - base); };  // area_off >= base
  if (!direct) std::memcpy(st(0), chunk.data(), chunk.size());
  std::memcpy(st(o_mats), mats.data(), mats.size() * sizeof(detail::MatDesc));
  std::memcpy(st(o_planes), planes.data(), planes.size() * sizeof(detail::PlaneDesc));
  if (!list_index.empty()) {
    std::memcpy(st(o_idx), list_index.data(), list_index.size() * 4);
    std::memcpy(st(o_val), list_value.data(), list_value.size() * 4);
  }
  uint64_t sym_bytes = 0;
  for (const auto& m : mats) sym_bytes += uint64_t(m.rows) * m.cols;
  KVS_RETURN_IF_ERROR(syms.reserve(sym_bytes, "symbols"));
  KVS_RETURN_IF_ERROR(mat_err.reserve(mats.size() * 4, "error words"));
  KVS_RETURN_IF_ERROR(err_host.reserve(mats.size() * 4));

  detail::ChunkLaunch c{};
  uint8_t* up = upload.as<uint8_t>();
  c.chunk = up;
  c.mats = reinterpret_cast<const detail::MatDesc*>(up + o_mats);
  c.n_mats = uint32_t(mats.size());
  c.syms = syms.as<int8_t>();
  c.mat_err = mat_err.as<uint32_t>();
  c.planes = reinterpret_cast<const detail::PlaneDesc*>(up + o_planes);
  c.n_planes = uint32_t(planes.size());
  c.list_index = reinterpret_cast<const uint32_t*>(up + o_idx);
  c.list_value = reinterpret_cast<const float*>(up + o_val);
  c.rope_ec = rotate ? rope_ec.as<float>() : nullptr;
  c.rope_es = rotate ? rope_es.as<float>() : nullptr;
  c.rope_partner = rotate ? rope_partner.as<uint32_t>() : nullptr;
  c.rot = rotate ? rope.rot : 0;
  c.head_dim = p.geom.head_dim;
  c.channels = C;
  c.tokens = T;
  c.group = p.group_size;
  c.prof = {mean.as<float>(), step_scale.as<float>(), predictor.as<uint8_t>(), transform_t.as<float>()};
  c.level = {levels[h.info.level].dec.as<uint32_t>(), levels[h.info.level].table_of.as<uint8_t>(),
             p.levels[h.info.level].info.step};
  c.out = out;
  c.dtype = int(dtype);

  KVS_CUDA(cudaEventRecord(cuda_event(ev[0]), stream), "cudaEventRecord");
  if (direct)
    KVS_CUDA(cudaMemcpyAsync(up, chunk.data(), chunk.size(), cudaMemcpyHostToDevice, stream),
             "chunk upload (page-locked)");
  KVS_CUDA(cudaMemcpyAsync(up + base, stage.data(), total - base, cudaMemcpyHostToDevice, stream), "chunk upload");
  KVS_CUDA(cudaEventRecord(cuda_event(ev[1]), stream), "cudaEventRecord");
  if (const int e = detail::launch_rans(c, stream); e != 0) return cuda_error(cudaError_t(e), "rANS kernel launch");
  KVS_CUDA(cudaEventRecord(cuda_event(ev[2]), stream), "cudaEventRecord");
  if (const int e = detail::launch_reconstruct(c, stream); e != 0)
    return cuda_error(cudaError_t(e), "reconstruction kernel launch");
  KVS_CUDA(cudaEventRecord(cuda_event(ev[3]), stream), "cudaEventRecord");
  if (!mats.empty())
    KVS_CUDA(cudaMemcpyAsync(err_host.data(), c.mat_err, mats.size() * 4, cudaMemcpyDeviceToHost, stream),
             "error read-back");
  KVS_CUDA(cudaStreamSynchronize(stream), "GPU decode");

  for (size_t i = 0; i < mats.size(); ++i) {
    uint32_t err;
    std::memcpy(&err, err_host.data() + 4 * i, 4);
    if (err & detail::kErrWords)
      return make_status(StatusCode::corrupt_data, "{}: rans: word stream overrun or words left over",
                         mat_where[i]);
    if (err & detail::kErrEscapes)
      return make_status(StatusCode::corrupt_data, "{}: rans: escape count mismatch", mat_where[i]);
    if (err & detail::kErrState)
      return make_status(StatusCode::corrupt_data, "{}: rans: a lane did not return to its initial state",
                         mat_where[i]);
  }
  timings = {elapsed(ev[0], ev[1]), elapsed(ev[1], ev[2]), elapsed(ev[2], ev[3])};
  return {};
}

Result<CopyBandwidth> measure_h2d_bandwidth(uint64_t bytes, int reps, int device) {
  KVS_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::allocate(bytes, device));
  PinnedBuf pinned;
  KVS_RETURN_IF_ERROR(pinned.reserve(bytes));
  std::vector<uint8_t> pageable(bytes, 1);
  std::memset(pinned.data(), 1, bytes);
  KVS_ASSIGN_OR_RETURN(Event a, Event::create(device));
  KVS_ASSIGN_OR_RETURN(Event b, Event::create(device));
  auto best = [&](const void* src) -> Result<double> {
    float best_ms = 0;
    for (int r = 0; r < std::max(reps, 1) + 1; ++r) {  // first one warms up
      KVS_CUDA(cudaEventRecord(cuda_event(a), nullptr), "cudaEventRecord");
      KVS_CUDA(cudaMemcpy(dst.data(), src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      KVS_CUDA(cudaEventRecord(cuda_event(b), nullptr), "cudaEventRecord");
      KVS_CUDA(cudaEventSynchronize(cuda_event(b)), "cudaEventSynchronize");
      const float ms = elapsed(a, b);
      if (r > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
    }
    return best_ms > 0 ? double(bytes) / (best_ms * 1e-3) / 1e9 : 0.0;
  };
  CopyBandwidth bw;
  KVS_ASSIGN_OR_RETURN(bw.pinned_gbps, best(pinned.data()));
  KVS_ASSIGN_OR_RETURN(bw.pageable_gbps, best(pageable.data()));
  return bw;
}

GpuDecoder::GpuDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuDecoder::~GpuDecoder() = default;

Result<std::unique_ptr<GpuDecoder>> GpuDecoder::create(const codec::Profile& profile, int device) {
  // The kernels read single-level streams (bitstream version 1); a progressive
  // profile's streams decode on the CPU until they read version 2.
  if (profile.progressive())
    return make_status(StatusCode::unsupported,
                       "GPU decoder: progressive profiles (bitstream version 2) decode on the CPU for now");
  KVS_ASSIGN_OR_RETURN(const DeviceInfo info, probe_device());
  (void)info;
  int count = 0;
  KVS_CUDA(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count)
    return make_status(StatusCode::unavailable, "GPU decoder: device {} of {}", device, count);
  auto impl = std::make_unique<Impl>();
  impl->profile = profile;
  impl->device = device;
  KVS_RETURN_IF_ERROR(impl->init());
  return std::unique_ptr<GpuDecoder>(new GpuDecoder(std::move(impl)));
}

const codec::Profile& GpuDecoder::profile() const noexcept { return impl_->profile; }
int GpuDecoder::device() const noexcept { return impl_->device; }
DecodeTimings GpuDecoder::last_timings() const noexcept { return impl_->timings; }

Status GpuDecoder::decode(std::span<const uint8_t> chunk, void* device_out, uint64_t device_out_bytes, DType dtype,
                          void* stream) {
  std::lock_guard lock(impl_->mu);
  return impl_->decode(chunk, device_out, device_out_bytes, dtype, static_cast<cudaStream_t>(stream));
}

Status GpuDecoder::decode_to_host(std::span<const uint8_t> chunk, const KvView& out) {
  KVS_ASSIGN_OR_RETURN(const codec::ChunkInfo info, codec::inspect_chunk(chunk));
  const KvGeometry& g = impl_->profile.geometry();
  if (!(out.geometry() == g))
    return make_status(StatusCode::invalid_argument, "output view geometry does not match the chunk");
  if (out.tokens() != info.tokens)
    return make_status(StatusCode::invalid_argument, "output view has {} tokens, the chunk {}", out.tokens(),
                       info.tokens);
  std::lock_guard lock(impl_->mu);
  Impl& s = *impl_;
  const uint64_t bytes = output_bytes(g, info.tokens, out.dtype());
  KVS_RETURN_IF_ERROR(s.out_host_path.reserve(bytes, "host-path output"));
  KVS_RETURN_IF_ERROR(s.decode(chunk, s.out_host_path.as<void>(), bytes, out.dtype(), cuda_stream(s.own_stream)));
  std::vector<std::byte> host(bytes);
  KVS_CUDA(cudaMemcpy(host.data(), s.out_host_path.as<void>(), bytes, cudaMemcpyDeviceToHost), "output download");
  const uint32_t C = g.channels();
  const size_t es = dtype_size(out.dtype()), row_bytes = size_t(C) * es;
  const std::byte* src = host.data();
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t pl = 0; pl < g.planes(); ++pl)
      for (uint64_t t = 0; t < info.tokens; ++t, src += row_bytes) {
        std::byte* dst = out.row(l, pl, t);
        if (out.rows_dense()) {
          std::memcpy(dst, src, row_bytes);
        } else {
          for (uint32_t c = 0; c < C; ++c) std::memcpy(dst + out.channel_offset(c) * int64_t(es), src + c * es, es);
        }
      }
  return {};
}

#else  // !KVSTREAM_HAVE_CUDA

struct GpuDecoder::Impl {};

Result<CopyBandwidth> measure_h2d_bandwidth(uint64_t, int, int) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}

GpuDecoder::GpuDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuDecoder::~GpuDecoder() = default;

Result<std::unique_ptr<GpuDecoder>> GpuDecoder::create(const codec::Profile& profile, int) {
  if (profile.progressive())
    return make_status(StatusCode::unsupported,
                       "GPU decoder: progressive profiles (bitstream version 2) decode on the CPU for now");
  KVS_ASSIGN_OR_RETURN(const DeviceInfo info, probe_device());  // logs once; `unsupported` here
  (void)info;
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}

namespace {
const codec::Profile& no_profile() {
  static const codec::Profile p;
  return p;
}
}  // namespace

const codec::Profile& GpuDecoder::profile() const noexcept { return no_profile(); }
int GpuDecoder::device() const noexcept { return -1; }
DecodeTimings GpuDecoder::last_timings() const noexcept { return {}; }
Status GpuDecoder::decode(std::span<const uint8_t>, void*, uint64_t, DType, void*) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}
Status GpuDecoder::decode_to_host(std::span<const uint8_t>, const KvView&) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}

#endif

}  // namespace kvstream::gpu
