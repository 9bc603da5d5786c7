// Host side of the GPU chunk decoder: device memory, uploads, launches, the ring of
// in-flight decodes and the integrity verdict. The chunk's parse and checks are in
// chunk_descriptors.cpp, where each element goes in output_plan.cpp, the kernels in
// cuda_decoder.cu.
#include <cstring>
#include <deque>
#include <mutex>

#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"

#if KVSTREAM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "codec/chunk_plan.hpp"
#include "codec/impl_access.hpp"
#include "codec/profile_impl.hpp"
#include "gpu/chunk_descriptors.hpp"
#include "gpu/cuda_buffers.hpp"
#include "codec/layered_codec.hpp"
#include "gpu/cuda_kernels.hpp"
#include "gpu/layered_descriptors.hpp"
#include "gpu/output_plan.hpp"
#endif

namespace kvstream::gpu {

uint64_t GpuDecoder::output_bytes(const KvGeometry& g, uint64_t tokens, DType dtype) noexcept {
  return g.elements_per_token() * tokens * dtype_size(dtype);
}

#if KVSTREAM_HAVE_CUDA

namespace {

using codec::Profile;
using codec::ProfileAccess;
using detail::cuda_error;
using detail::cuda_event;
using detail::elapsed;
using detail::DevBuf;
using detail::PinnedBuf;
static_assert(detail::kProbBits == codec::PROB_BITS && detail::kLanes == codec::RANS_LANES);

struct LevelState {
  bool loaded = false;
  DevBuf dec, table_of;
};

// One decode's buffers, from staging to verdict. A slot is reused only after its
// `done` event, recorded behind the verdict callback, has been reached.
struct Slot {
  PinnedBuf stage;        // [chunk unless page-locked] descriptors, lists, output plan, RoPE tables
  DevBuf upload;          // device copy of the staging area
  DevBuf syms, mat_err, verdict;
  DevBuf q, ids, rsyms;   // progressive streams: refined indices, a layer's table ids and symbols
  PinnedBuf verdict_host; // the verdict's two words, copied back
  Event ev[4];            // upload, rANS, reconstruction, end (timings)
  Event done;
  bool in_flight = false;
  bool timed = false;
  // Read by the callback.
  std::vector<std::string> mat_where;
  uint64_t tag = 0;
  DecodeDone callback;
};

// The verdict of a finished decode, as the CPU decoder words it.
Status verdict_of(const Slot& s) {
  uint32_t v[2];
  std::memcpy(v, s.verdict_host.data(), sizeof v);
  if (v[0] == 0) return {};
  const size_t m = v[0] - 1;
  const std::string& where = m < s.mat_where.size() ? s.mat_where[m] : std::string("a matrix");
  if (v[1] & detail::kErrWords)
    return make_status(StatusCode::corrupt_data, "{}: rans: word stream overrun or words left over", where);
  if (v[1] & detail::kErrEscapes) return make_status(StatusCode::corrupt_data, "{}: rans: escape count mismatch", where);
  return make_status(StatusCode::corrupt_data, "{}: rans: a lane did not return to its initial state", where);
}

// cudaLaunchHostFunc's callback: runs on a CUDA runtime thread once the verdict has
// been copied back. Nothing may escape into CUDA's thread.
void CUDART_CB deliver_verdict(void* arg) {
  Slot& s = *static_cast<Slot*>(arg);
  if (!s.callback) return;
  try {
    s.callback(s.tag, verdict_of(s));
  } catch (...) {
    // A throwing callback is the caller's bug; the decoder has nothing to undo.
  }
}

// What the kernels need of a parsed chunk, of either stream version.
struct Parsed {
  const std::vector<detail::MatDesc>* mats;
  const std::vector<detail::PlaneDesc>* planes;
  const std::vector<uint32_t>* list_index;
  const std::vector<float>* list_value;
  std::vector<std::string>* mat_where;  // handed to the slot (the parse refills it next time)
  uint32_t tokens = 0;
  uint64_t first_position = 0;
  std::vector<uint32_t> levels;  // whose tables the decode reads
};

// Switches this thread to the relaxed capture mode while it lives (when `on`).
class RelaxedCapture {
 public:
  explicit RelaxedCapture(bool on) : on_(on) {
    if (on_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  ~RelaxedCapture() {
    if (on_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  bool on_;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
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
  // The ring of in-flight decodes, and the slots graph captures keep.
  std::vector<std::unique_ptr<Slot>> ring;
  size_t next = 0;
  std::deque<std::unique_ptr<Slot>> captured;
  DevBuf out_host_path;
  Stream own_stream;
  DecodeTimings timings;
  // RoPE tables of the last chunk (rebuilt when first position or token count change).
  codec::RopeTable rope;
  bool rope_valid = false;
  uint64_t rope_first = 0;
  uint32_t rope_tokens = 0;
  detail::ChunkDescriptors desc;     // host scratch, single-level chunks
  detail::LayeredDescriptors ldesc;  // host scratch, progressive streams

  ~Impl();
  Status init();
  Status ensure_level(uint32_t level);
  Result<Slot*> new_slot();
  Result<Slot*> acquire(bool capturing);
  Status check_view(const KvView& out, uint32_t tokens) const;
  Result<Parsed> parse(std::span<const uint8_t> chunk, bool& layered);
  // `landed`: the chunk's bytes already in device memory (GPUDirect); `chunk` is then
  // their host copy, parsed and checked here, and nothing is uploaded.
  Status enqueue(std::span<const uint8_t> chunk, const KvView& out, cudaStream_t stream, uint64_t tag, DecodeDone done,
                 Slot*& used, const void* landed = nullptr);
  Status decode_sync(std::span<const uint8_t> chunk, const KvView& out, cudaStream_t stream,
                     const void* landed = nullptr);
};

GpuDecoder::Impl::~Impl() {
  // Kernels and callbacks may still use the slots' memory.
  for (const auto& s : ring)
    if (s->in_flight) cudaEventSynchronize(cuda_event(s->done));
  if (!captured.empty()) cudaDeviceSynchronize();  // a graph may still be replaying
}

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
  for (unsigned i = 0; i < kMaxInFlight; ++i) {
    KVS_ASSIGN_OR_RETURN(Slot * s, new_slot());
    (void)s;
  }
  return {};
}

Result<Slot*> GpuDecoder::Impl::new_slot() {
  auto s = std::make_unique<Slot>();
  for (Event& e : s->ev) {
    KVS_ASSIGN_OR_RETURN(e, Event::create(device));
  }
  KVS_ASSIGN_OR_RETURN(s->done, Event::create(device));
  KVS_RETURN_IF_ERROR(s->verdict.reserve(8, "verdict"));
  KVS_RETURN_IF_ERROR(s->verdict_host.reserve(8));
  ring.push_back(std::move(s));
  return ring.back().get();
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

// The next slot of the ring once its previous decode has finished; during a graph
// capture a new slot, which the graph keeps.
Result<Slot*> GpuDecoder::Impl::acquire(bool capturing) {
  if (capturing) {
    KVS_ASSIGN_OR_RETURN(Slot * s, new_slot());
    captured.push_back(std::move(ring.back()));
    ring.pop_back();
    return s;
  }
  Slot* s = ring[next].get();
  next = (next + 1) % ring.size();
  if (s->in_flight) KVS_CUDA(cudaEventSynchronize(cuda_event(s->done)), "waiting for an earlier decode");
  s->in_flight = false;
  return s;
}

Status GpuDecoder::Impl::check_view(const KvView& out, uint32_t tokens) const {
  const Profile::Impl& p = ProfileAccess::of(profile);
  if (!(out.geometry() == p.geom))
    return make_status(StatusCode::invalid_argument, "output view geometry does not match the chunk");
  if (out.tokens() != tokens)
    return make_status(StatusCode::invalid_argument, "output view has {} tokens, the chunk {}", out.tokens(), tokens);
  if (out.dtype() != DType::f32 && out.dtype() != DType::f16 && out.dtype() != DType::bf16)
    return make_status(StatusCode::invalid_argument, "unknown output element type {}", int(out.dtype()));
  // A host pointer would fault inside the kernel, and a fault ends the whole CUDA
  // context: every plane's memory is checked before anything is enqueued.
  for (uint32_t l = 0; l < p.geom.layers; ++l)
    for (uint32_t pl = 0; pl < p.geom.planes(); ++pl)
      if (Status st = check_device_pointer(out.row(l, pl, 0), device); !st.ok())
        return make_status(StatusCode::invalid_argument, "GPU decode output, layer {} plane {}: {}", l, pl,
                           st.message());
  return {};
}


Result<Parsed> GpuDecoder::Impl::parse(std::span<const uint8_t> chunk, bool& layered) {
  layered = codec::is_layered(chunk);
  Parsed r;
  if (layered) {
    KVS_RETURN_IF_ERROR(detail::parse_layered_chunk(profile, ut_off, chunk, ldesc));
    r = {&ldesc.mats, &ldesc.planes, &ldesc.list_index, &ldesc.list_value, &ldesc.mat_where,
         ldesc.header.info.tokens, ldesc.header.info.first_position, {}};
    for (const auto& st : ldesc.steps) r.levels.push_back(st.level);
  } else {
    KVS_RETURN_IF_ERROR(detail::parse_chunk(profile, ut_off, chunk, desc));
    r = {&desc.mats, &desc.planes, &desc.list_index, &desc.list_value, &desc.mat_where,
         desc.header.info.tokens, desc.header.info.first_position, {desc.header.info.level}};
  }
  return r;
}

Status GpuDecoder::Impl::enqueue(std::span<const uint8_t> chunk, const KvView& out, cudaStream_t stream, uint64_t tag,
                                 DecodeDone done, Slot*& used, const void* landed) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  KVS_CUDA(cudaSetDevice(device), "cudaSetDevice");
  bool layered = false;
  KVS_ASSIGN_OR_RETURN(const Parsed d, parse(chunk, layered));
  const uint32_t T = d.tokens, C = p.geom.channels();
  KVS_RETURN_IF_ERROR(check_view(out, T));
  KVS_ASSIGN_OR_RETURN(const detail::OutputPlan plan, detail::plan_output(out));
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  KVS_CUDA(cudaStreamIsCapturing(stream, &cs), "cudaStreamIsCapturing");
  const bool capturing = cs == cudaStreamCaptureStatusActive;
  // A captured decode's buffers are allocated now, outside the graph (cudaMalloc is
  // not a stream operation, and the graph replays into the same buffers), so the
  // capture must tolerate the allocation calls.
  const RelaxedCapture relaxed(capturing);
  KVS_ASSIGN_OR_RETURN(Slot * s, acquire(capturing));
  for (const uint32_t level : d.levels) {
    if (capturing && !levels[level].loaded)
      return make_status(StatusCode::invalid_argument,
                         "GPU decode inside a graph capture needs level {}'s tables loaded first (load_levels())", level);
    KVS_RETURN_IF_ERROR(ensure_level(level));
  }

  // RoPE tables: the CPU's code, built on the host (cached), staged with the chunk so
  // that decodes in flight never share them.
  const bool rotate = codec::unrotates(p, 0);
  if (rotate && (!rope_valid || rope_first != d.first_position || rope_tokens != T)) {
    rope.build(p.rope, p.geom.head_dim, d.first_position, T);
    rope_valid = true, rope_first = d.first_position, rope_tokens = T;
  }

  // One device upload area: chunk | mats | planes | list index | list value | output
  // plan | RoPE. When the chunk lies in page-locked memory (the pipeline's registered
  // receive buffers) it is copied from there by DMA and only the rest is staged.
  const bool direct = landed == nullptr && detail::page_locked(chunk.data());
  using detail::align_up;
  const auto& mats = *d.mats;
  const size_t o_mats = align_up(chunk.size(), 16);
  const size_t o_planes = align_up(o_mats + mats.size() * sizeof(detail::MatDesc), 16);
  const size_t o_idx = align_up(o_planes + d.planes->size() * sizeof(detail::PlaneDesc), 16);
  const size_t o_val = align_up(o_idx + d.list_index->size() * 4, 16);
  const size_t o_row0 = align_up(o_val + d.list_value->size() * 4, 16);
  const size_t o_tok = align_up(o_row0 + plan.row0.size() * 8, 16);
  const size_t o_chan = align_up(o_tok + plan.token.size() * 8, 16);
  const size_t rope_n = rotate ? rope.ec.size() : 0;
  const size_t o_ec = align_up(o_chan + plan.channel.size() * 8, 16);
  const size_t o_es = align_up(o_ec + rope_n * 4, 16);
  const size_t o_partner = align_up(o_es + rope_n * 4, 16);
  const size_t total = align_up(o_partner + (rotate ? rope.partner.size() * 4 : 0), 16);
  const size_t base = direct || landed ? o_mats : 0;  // the staging buffer holds [base, total)
  KVS_RETURN_IF_ERROR(s->stage.reserve(total - base));
  KVS_RETURN_IF_ERROR(s->upload.reserve(total, "chunk upload"));
  auto put = [&](size_t area_off, const void* src, size_t n) {
    if (n) std::memcpy(s->stage.data() + (area_off - base), src, n);
  };
  if (base == 0) put(0, chunk.data(), chunk.size());
  put(o_mats, mats.data(), mats.size() * sizeof(detail::MatDesc));
  put(o_planes, d.planes->data(), d.planes->size() * sizeof(detail::PlaneDesc));
  put(o_idx, d.list_index->data(), d.list_index->size() * 4);
  put(o_val, d.list_value->data(), d.list_value->size() * 4);
  put(o_row0, plan.row0.data(), plan.row0.size() * 8);
  put(o_tok, plan.token.data(), plan.token.size() * 8);
  put(o_chan, plan.channel.data(), plan.channel.size() * 8);
  if (rotate) {
    put(o_ec, rope.ec.data(), rope_n * 4);
    put(o_es, rope.es.data(), rope_n * 4);
    put(o_partner, rope.partner.data(), rope.partner.size() * 4);
  }
  // Symbols: a single-level chunk's matrices end to end; a progressive stream's base
  // indices [plane][T][C], widened into q, and one refinement layer's symbols and
  // table ids at a time, [plane][rows][C].
  const uint64_t plane_elems = uint64_t(p.geom.layers) * p.geom.planes() * T * C;
  uint64_t sym_bytes = 0;
  for (const auto& m : mats) sym_bytes += uint64_t(m.rows) * m.cols;
  KVS_RETURN_IF_ERROR(s->syms.reserve(layered ? plane_elems : sym_bytes, "symbols"));
  if (layered) {
    KVS_RETURN_IF_ERROR(s->q.reserve(plane_elems * 4, "refined indices"));
    KVS_RETURN_IF_ERROR(s->ids.reserve(plane_elems, "refinement table ids"));
    KVS_RETURN_IF_ERROR(s->rsyms.reserve(plane_elems, "refinement symbols"));
  }
  KVS_RETURN_IF_ERROR(s->mat_err.reserve(mats.size() * 4, "error words"));

  detail::ChunkLaunch c{};
  uint8_t* up = s->upload.as<uint8_t>();
  c.chunk = landed ? static_cast<const uint8_t*>(landed) : up;
  c.mats = reinterpret_cast<const detail::MatDesc*>(up + o_mats);
  c.n_mats = uint32_t(mats.size());
  c.syms = s->syms.as<int8_t>();
  c.q = layered ? s->q.as<int32_t>() : nullptr;
  c.mat_err = s->mat_err.as<uint32_t>();
  c.planes = reinterpret_cast<const detail::PlaneDesc*>(up + o_planes);
  c.n_planes = uint32_t(d.planes->size());
  c.list_index = reinterpret_cast<const uint32_t*>(up + o_idx);
  c.list_value = reinterpret_cast<const float*>(up + o_val);
  c.rope_ec = rotate ? reinterpret_cast<const float*>(up + o_ec) : nullptr;
  c.rope_es = rotate ? reinterpret_cast<const float*>(up + o_es) : nullptr;
  c.rope_partner = rotate ? reinterpret_cast<const uint32_t*>(up + o_partner) : nullptr;
  c.rot = rotate ? rope.rot : 0;
  c.head_dim = p.geom.head_dim;
  c.channels = C;
  c.tokens = T;
  c.group = p.group_size;
  c.prof = {mean.as<float>(), step_scale.as<float>(), predictor.as<uint8_t>(), transform_t.as<float>()};
  c.level = {levels[d.levels[0]].dec.as<uint32_t>(), levels[d.levels[0]].table_of.as<uint8_t>()};
  c.out_row0 = reinterpret_cast<const uint64_t*>(up + o_row0);
  c.out_token = reinterpret_cast<const int64_t*>(up + o_tok);
  c.out_chan = reinterpret_cast<const int64_t*>(up + o_chan);
  c.dtype = int(out.dtype());
  c.verdict = s->verdict.as<uint32_t>();

  // Timing events only outside a capture (a captured event cannot be timed).
  s->timed = !capturing;
  auto mark = [&](int i) -> Status {
    if (s->timed) KVS_CUDA(cudaEventRecord(cuda_event(s->ev[i]), stream), "cudaEventRecord");
    return {};
  };
  auto launched = [](int e, std::string_view what) -> Status {
    return e == 0 ? Status{} : cuda_error(cudaError_t(e), what);
  };
  // From the first copy on, the slot's buffers are in use by the stream: a launch that
  // fails half way still marks the slot busy until what was queued has run.
  struct Busy {
    Slot* s;
    cudaStream_t stream;
    bool capturing;
    ~Busy() {
      if (!capturing && !s->in_flight && cudaEventRecord(cuda_event(s->done), stream) == cudaSuccess)
        s->in_flight = true;
    }
  } busy{s, stream, capturing};
  KVS_RETURN_IF_ERROR(mark(0));
  if (direct)
    KVS_CUDA(cudaMemcpyAsync(up, chunk.data(), chunk.size(), cudaMemcpyHostToDevice, stream),
             "chunk upload (page-locked)");
  KVS_CUDA(cudaMemcpyAsync(up + base, s->stage.data(), total - base, cudaMemcpyHostToDevice, stream), "chunk upload");
  KVS_RETURN_IF_ERROR(mark(1));
  if (!layered) {
    KVS_RETURN_IF_ERROR(launched(detail::launch_rans(c, stream), "rANS kernel launch"));
  } else {
    // The base, widened; then each refinement layer: table ids from the coarser
    // indices, its symbols, the indices refined.
    const size_t ch_total = p.channels_total();
    for (const auto& st : ldesc.steps) {
      const LevelState& lv = levels[st.level];
      if (!st.refine) {
        KVS_RETURN_IF_ERROR(launched(detail::launch_rans_mats(c.chunk, c.mats + st.first_mat, st.n_mats,
                                                              lv.dec.as<uint32_t>(), lv.table_of.as<uint8_t>(), c.syms,
                                                              c.mat_err + st.first_mat, stream),
                                     "rANS kernel launch (base layer)"));
        KVS_RETURN_IF_ERROR(launched(detail::launch_widen(c.syms, s->q.as<int32_t>(), plane_elems, stream),
                                     "widen kernel launch"));
        continue;
      }
      const detail::RefineRows rr{s->q.as<int32_t>(), s->ids.as<uint8_t>(), s->rsyms.as<int8_t>(),
                                  lv.table_of.as<uint8_t>() + size_t(codec::kRoleCoarseZero) * ch_total,
                                  lv.table_of.as<uint8_t>() + size_t(codec::kRoleCoarseNonzero) * ch_total,
                                  st.planes, T, C, st.row0, st.rows};
      KVS_RETURN_IF_ERROR(launched(detail::launch_refinement_ids(rr, stream), "table id kernel launch"));
      KVS_RETURN_IF_ERROR(launched(detail::launch_rans_mats(c.chunk, c.mats + st.first_mat, st.n_mats, lv.dec.as<uint32_t>(),
                                                            s->ids.as<uint8_t>(), s->rsyms.as<int8_t>(),
                                                            c.mat_err + st.first_mat, stream),
                                   "rANS kernel launch (refinement layer)"));
      KVS_RETURN_IF_ERROR(launched(detail::launch_refine(rr, stream), "refine kernel launch"));
    }
  }
  KVS_RETURN_IF_ERROR(mark(2));
  KVS_RETURN_IF_ERROR(launched(detail::launch_reconstruct(c, stream), "reconstruction kernel launch"));
  KVS_RETURN_IF_ERROR(launched(detail::launch_verdict(c, stream), "verdict kernel launch"));
  KVS_RETURN_IF_ERROR(mark(3));
  KVS_CUDA(cudaMemcpyAsync(s->verdict_host.data(), c.verdict, 8, cudaMemcpyDeviceToHost, stream), "verdict read-back");
  s->mat_where.swap(*d.mat_where);  // no copy per chunk: the scratch is refilled by the next parse
  s->tag = tag;
  s->callback = std::move(done);
  if (s->callback) KVS_CUDA(cudaLaunchHostFunc(stream, deliver_verdict, s), "cudaLaunchHostFunc");
  if (!capturing) {
    KVS_CUDA(cudaEventRecord(cuda_event(s->done), stream), "cudaEventRecord");
    s->in_flight = true;
  }
  used = s;
  return {};
}

Status GpuDecoder::Impl::decode_sync(std::span<const uint8_t> chunk, const KvView& out, cudaStream_t stream,
                                     const void* landed) {
  Slot* s = nullptr;
  KVS_RETURN_IF_ERROR(enqueue(chunk, out, stream, 0, nullptr, s, landed));
  KVS_CUDA(cudaStreamSynchronize(stream), "GPU decode");
  KVS_RETURN_IF_ERROR(verdict_of(*s));
  if (s->timed)
    timings = {detail::elapsed(s->ev[0], s->ev[1]), detail::elapsed(s->ev[1], s->ev[2]),
               detail::elapsed(s->ev[2], s->ev[3])};
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
  KVS_ASSIGN_OR_RETURN(const codec::ChunkInfo info, codec::inspect_chunk(chunk));
  const KvGeometry& g = impl_->profile.geometry();
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    return make_status(StatusCode::invalid_argument, "unknown output element type {}", int(dtype));
  const uint64_t need = output_bytes(g, info.tokens, dtype);
  if (device_out == nullptr || device_out_bytes < need)
    return make_status(StatusCode::invalid_argument, "GPU decode needs {} bytes of output, got {}", need,
                       device_out == nullptr ? 0 : device_out_bytes);
  KVS_ASSIGN_OR_RETURN(const KvView view, KvView::packed(device_out, dtype, g, info.tokens, info.first_position));
  std::lock_guard lock(impl_->mu);
  return impl_->decode_sync(chunk, view, static_cast<cudaStream_t>(stream));
}

Status GpuDecoder::decode(std::span<const uint8_t> chunk, const KvView& device_out, void* stream) {
  std::lock_guard lock(impl_->mu);
  return impl_->decode_sync(chunk, device_out, static_cast<cudaStream_t>(stream));
}

Status GpuDecoder::decode_landed(std::span<const uint8_t> host_copy, const void* device_chunk,
                                 const KvView& device_out, void* stream) {
  std::lock_guard lock(impl_->mu);
  if (Status st = check_device_pointer(device_chunk, impl_->device); !st.ok())
    return make_status(StatusCode::invalid_argument, "GPUDirect chunk: {}", st.message());
  return impl_->decode_sync(host_copy, device_out, static_cast<cudaStream_t>(stream), device_chunk);
}

Status GpuDecoder::refine(std::span<const uint8_t> kept, std::span<const uint8_t> more, const KvView& device_out,
                          void* stream) {
  if (!codec::is_layered(kept))
    return make_status(StatusCode::invalid_argument, "refine needs a prefix of a progressive stream");
  KVS_ASSIGN_OR_RETURN(const codec::LayeredHeader h, codec::parse_layered_header(kept));
  if (Result<codec::PrefixExtent> k = codec::prefix_extent(h, kept.size()); !k.ok())
    return make_status(StatusCode::invalid_argument, "refinement: the kept bytes are not a prefix: {}",
                       k.status().message());
  // As on the CPU, the refinement is the decode of the longer prefix (bit for bit what
  // decoding it directly gives); the two pieces are joined in the staging upload.
  std::vector<uint8_t> joined(kept.begin(), kept.end());
  joined.insert(joined.end(), more.begin(), more.end());
  std::lock_guard lock(impl_->mu);
  return impl_->decode_sync(joined, device_out, static_cast<cudaStream_t>(stream));
}

Status GpuDecoder::enqueue(std::span<const uint8_t> chunk, const KvView& device_out, void* stream, uint64_t tag,
                           DecodeDone done) {
  std::lock_guard lock(impl_->mu);
  Slot* used = nullptr;
  return impl_->enqueue(chunk, device_out, static_cast<cudaStream_t>(stream), tag, std::move(done), used);
}

Status GpuDecoder::load_levels() {
  std::lock_guard lock(impl_->mu);
  KVS_CUDA(cudaSetDevice(impl_->device), "cudaSetDevice");
  for (uint32_t l = 0; l < impl_->levels.size(); ++l) KVS_RETURN_IF_ERROR(impl_->ensure_level(l));
  return {};
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
  KVS_ASSIGN_OR_RETURN(const KvView dev,
                       KvView::packed(s.out_host_path.as<void>(), out.dtype(), g, info.tokens, info.first_position));
  KVS_RETURN_IF_ERROR(s.decode_sync(chunk, dev, detail::cuda_stream(s.own_stream)));
  std::vector<std::byte> host(bytes);
  KVS_CUDA(cudaMemcpy(host.data(), s.out_host_path.as<void>(), bytes, cudaMemcpyDeviceToHost), "output download");
  KVS_ASSIGN_OR_RETURN(const KvView packed, KvView::packed(host.data(), out.dtype(), g, info.tokens, info.first_position));
  return copy_kv(packed, out);
}

#else  // !KVSTREAM_HAVE_CUDA

struct GpuDecoder::Impl {};

Result<CopyBandwidth> measure_h2d_bandwidth(uint64_t, int, int) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}

GpuDecoder::GpuDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuDecoder::~GpuDecoder() = default;

Result<std::unique_ptr<GpuDecoder>> GpuDecoder::create(const codec::Profile&, int) {
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
Status GpuDecoder::decode(std::span<const uint8_t>, const KvView&, void*) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}
Status GpuDecoder::enqueue(std::span<const uint8_t>, const KvView&, void*, uint64_t, DecodeDone) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}
Status GpuDecoder::load_levels() { return make_status(StatusCode::unsupported, "kvstream was built without CUDA"); }
Status GpuDecoder::refine(std::span<const uint8_t>, std::span<const uint8_t>, const KvView&, void*) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}
Status GpuDecoder::decode_landed(std::span<const uint8_t>, const void*, const KvView&, void*) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}
Status GpuDecoder::decode_to_host(std::span<const uint8_t>, const KvView&) {
  return make_status(StatusCode::unsupported, "kvstream was built without CUDA");
}

#endif

}  // namespace kvstream::gpu
