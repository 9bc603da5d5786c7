// Host parse of a single-level chunk into the GPU kernels' descriptors
// (chunk_descriptors.hpp).
#include "gpu/chunk_descriptors.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "codec/chunk_plan.hpp"
#include "codec/entropy/rans_format.hpp"
#include "codec/impl_access.hpp"
#include "codec/profile_impl.hpp"

namespace kvstream::gpu::detail {

using codec::Profile;
using codec::ProfileAccess;

Result<size_t> frame_matrix(std::span<const uint8_t> bytes, size_t at, size_t len, uint64_t n, bool whole, MatDesc& m,
                            const std::string& where) {
  const std::span<const uint8_t> rest = bytes.subspan(at, len);
  KVS_ASSIGN_OR_RETURN(const size_t size, codec::rans_coded_size(rest));
  if (whole ? size != rest.size() : size > rest.size())
    return make_status(StatusCode::corrupt_data, "{}: rans: {} bytes, header says {}", where, rest.size(), size);
  m.n_words = codec::rans_format::load_u32(rest.data() + 4);
  m.n_escapes = codec::rans_format::load_u32(rest.data() + 8);
  if (m.n_words > n || m.n_escapes > n)
    return make_status(StatusCode::corrupt_data, "{}: rans: {} words / {} escapes for {} symbols", where, m.n_words,
                       m.n_escapes, n);
  m.words_off = at + 12;
  m.escapes_off = m.words_off + 2 * uint64_t(m.n_words);
  const uint8_t* st = rest.data() + 12 + 2 * size_t(m.n_words) + m.n_escapes;
  for (int k = 0; k < kLanes; ++k) {
    m.state[k] = codec::rans_format::load_u32(st + 4 * k);
    if (m.state[k] < (1u << 16))
      return make_status(StatusCode::corrupt_data, "{}: rans: lane {} start state too low", where, k);
  }
  return size;
}

// Header, profile and payload checks of open_chunk(), then each substream with the
// checks of decode_matrix() and of rans_decode() that need no decoding. Fills the
// matrix and plane descriptors (offsets relative to the chunk's first byte).
Status parse_chunk(const codec::Profile& profile, std::span<const uint64_t> ut_off, std::span<const uint8_t> bytes,
                   ChunkDescriptors& d) {
  const Profile::Impl& p = ProfileAccess::of(profile);
  codec::ChunkHeader& h = d.header;
  size_t off = 0;
  KVS_ASSIGN_OR_RETURN(h, codec::parse_header_for(profile, bytes, &off));
  KVS_RETURN_IF_ERROR(codec::verify_payload(bytes, off));
  auto& mats = d.mats;
  auto& planes = d.planes;
  auto& list_index = d.list_index;
  auto& list_value = d.list_value;
  auto& mat_where = d.mat_where;

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

      PlaneDesc pd{};
      pd.chan_off = p.idx(l, pl, 0);
      pd.ut_off = ut_off[si];
      pd.block = block;
      pd.has_anchor = has_anchor;
      pd.rotate = codec::unrotates(p, pl);
      pd.plane_index = uint32_t(si);
      pd.step = pd.recent_step = p.levels[level].info.step;
      pd.split = T;

      size_t pos = 0;
      auto read_list = [&](uint32_t& begin, uint32_t& count) -> Status {
        const bool ok = pos + 4 <= sub_len;
        const uint32_t n = ok ? codec::rans_format::load_u32(sub + pos) : 0;
        if (ok) pos += 4;
        if (!ok || uint64_t(n) > TC || uint64_t(n) * 8 > sub_len - pos)
          return make_status(StatusCode::corrupt_data, "{}: bad outlier count", where());
        begin = uint32_t(list_index.size()), count = n;
        for (uint32_t i = 0; i < n; ++i, pos += 8) {
          const uint32_t idx = codec::rans_format::load_u32(sub + pos);
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
        const uint8_t* tid = p.levels[level].table_of[role].data() + pd.chan_off;
        for (uint32_t c = 0; c < C; ++c)
          if (tid[c] >= tables.size())
            return make_status(StatusCode::invalid_argument, "{}: column {} uses table {} of {}", where(), c, tid[c],
                               tables.size());
        if (rows > std::numeric_limits<uint32_t>::max() / C)
          return make_status(StatusCode::out_of_range, "{}: {} x {} symbols exceed 2^32 - 1", where(), rows, C);
        const uint64_t n = uint64_t(rows) * C;
        MatDesc m{};
        KVS_ASSIGN_OR_RETURN(const size_t len, frame_matrix(bytes, sub_base + pos, sub_len - pos, n, false, m,
                                                            fmt::format("{} {}", where(), what)));
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

}  // namespace kvstream::gpu::detail
