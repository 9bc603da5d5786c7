// Profile: serialization, hashing, validation.
#include <cmath>
#include <cstdio>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include "codec/bitstream.hpp"
#include "codec/byte_io.hpp"
#include "codec/profile_impl.hpp"

namespace kvstream::codec {

namespace {
constexpr char kMagic[4] = {'K', 'V', 'S', 'P'};
}

bool Profile::Impl::has_anchor(uint32_t l, uint32_t p) const {
  const size_t b = idx(l, p, 0);
  for (uint32_t c = 0; c < geom.channels(); ++c)
    if (predictor[b + c] == uint8_t(Predictor::anchor)) return true;
  return false;
}

std::vector<uint8_t> Profile::Impl::body() const {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.put(geom.layers), w.put(geom.kv_heads), w.put(geom.head_dim), w.put(geom.q_heads), w.put(uint8_t(geom.kind));
  w.put(uint8_t(rope.enabled)), w.put(rope.base), w.put(rope.rotary_dim), w.put(uint8_t(rope.pairing));
  w.put(uint8_t(k_before_rope)), w.put(group_size);
  w.put_array(predictor), w.put_array(mean), w.put_array(step_scale);
  for (size_t lp = 0; lp < size_t(geom.layers) * geom.planes(); ++lp) {
    w.put(block_of(lp));
    if (block_of(lp)) w.put_array(transform[lp]);
  }
  w.put(uint32_t(levels.size()));
  for (const Level& lv : levels) {
    w.put(lv.info.step), w.put(lv.info.bits_per_element), w.put(lv.info.ppl_increase_pct), w.put(lv.info.kl_nats);
    w.put(uint32_t(lv.tables.size()));
    for (const FreqTable& t : lv.tables) t.serialize(out);
    for (uint32_t r = 0; r < kRoles; ++r) w.put_array(lv.table_of[r]);
  }
  if (progressive) {
    w.put(uint8_t(1));
    for (const Level& lv : levels) w.put(lv.info.distortion);
    if (recent_tokens) w.put(recent_tokens), w.put(recent_layers);
    if (recent_lead) w.put(uint8_t(1));
  }
  return out;
}

Status Profile::Impl::finalize() {
  const size_t LP = size_t(geom.layers) * geom.planes();
  transform_block.resize(LP, 0);
  transform.resize(LP);
  transform_t.assign(LP, {});
  for (size_t lp = 0; lp < LP; ++lp) {
    const uint32_t B = transform_block[lp];
    if (!B) continue;
    const std::vector<float>& u = transform[lp];
    std::vector<float>& t = transform_t[lp];
    t.resize(u.size());
    for (size_t b = 0; b < u.size() / (size_t(B) * B); ++b)
      for (uint32_t r = 0; r < B; ++r)
        for (uint32_t c = 0; c < B; ++c) t[b * B * B + size_t(c) * B + r] = u[b * B * B + size_t(r) * B + c];
  }
  for (Level& lv : levels) {
    KVS_ASSIGN_OR_RETURN(RansTables t, RansTables::build(lv.tables));
    lv.rans = std::make_shared<const RansTables>(std::move(t));
  }
  refine_chain.reset(), chain_table_of.clear();
  size_t refine_tables = 0;
  for (uint32_t k = 1; progressive && k < levels.size(); ++k) refine_tables += levels[level_of_layer(k)].tables.size();
  if (refine_tables > 0 && refine_tables <= RANS_MAX_TABLES) {
    std::vector<FreqTable> all;
    for (uint32_t k = 1; k < levels.size(); ++k) {
      const Level& lv = levels[level_of_layer(k)];
      const size_t offset = all.size();
      all.insert(all.end(), lv.tables.begin(), lv.tables.end());
      auto& shifted = chain_table_of.emplace_back();
      for (uint32_t r = 0; r < kRoles; ++r)
        for (uint8_t id : lv.table_of[r]) shifted[r].push_back(uint8_t(offset + id));
    }
    KVS_ASSIGN_OR_RETURN(RansTables t, RansTables::build(all));
    refine_chain = std::make_shared<const RansTables>(std::move(t));
  }
  const std::vector<uint8_t> b = body();
  hash = XXH3_64bits(b.data(), b.size());
  return {};
}

Profile::Profile() : impl_(std::make_unique<Impl>()) {}
Profile::~Profile() = default;
Profile::Profile(Profile&&) noexcept = default;
Profile& Profile::operator=(Profile&&) noexcept = default;
Profile::Profile(const Profile& o) : impl_(std::make_unique<Impl>(*o.impl_)) {}
Profile& Profile::operator=(const Profile& o) {
  if (this != &o) impl_ = std::make_unique<Impl>(*o.impl_);
  return *this;
}
Profile::Profile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

uint64_t Profile::hash() const noexcept { return impl_->hash; }
const KvGeometry& Profile::geometry() const noexcept { return impl_->geom; }
const RopeParams& Profile::rope() const noexcept { return impl_->rope; }
bool Profile::codes_k_before_rope() const noexcept { return impl_->k_before_rope; }
uint32_t Profile::group_size() const noexcept { return impl_->group_size; }
uint32_t Profile::levels() const noexcept { return uint32_t(impl_->levels.size()); }
bool Profile::progressive() const noexcept { return impl_->progressive; }
uint32_t Profile::recent_tokens() const noexcept { return impl_->recent_tokens; }
uint32_t Profile::recent_layers() const noexcept { return impl_->recent_layers; }
bool Profile::recent_lead() const noexcept { return impl_->recent_lead; }
const LevelInfo& Profile::level(uint32_t i) const { return impl_->levels.at(i).info; }
Predictor Profile::predictor(uint32_t l, uint32_t p, uint32_t c) const {
  return Predictor(impl_->predictor.at(impl_->idx(l, p, c)));
}
std::vector<uint64_t> Profile::predictor_counts() const {
  std::vector<uint64_t> n(3, 0);
  for (uint8_t p : impl_->predictor) ++n[p];
  return n;
}

Status Profile::set_level_quality(uint32_t level, double ppl_increase_pct, double kl_nats, double distortion) {
  if (level >= impl_->levels.size())
    return make_status(StatusCode::out_of_range, "level {} of a {}-level profile", level, impl_->levels.size());
  if (!std::isfinite(distortion) || (distortion < 0 && distortion != -1))
    return make_status(StatusCode::invalid_argument, "level {} distortion {} (>= 0, or -1)", level, distortion);
  if (distortion >= 0) impl_->levels[level].info.distortion = distortion;
  impl_->levels[level].info.ppl_increase_pct = ppl_increase_pct;
  impl_->levels[level].info.kl_nats = kl_nats;
  return impl_->finalize();
}

std::vector<uint8_t> Profile::serialize() const {
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  ByteWriter w(out);
  w.put(!impl_->progressive ? kProfileVersion
                             : impl_->recent_lead     ? kRecentLeadProfileVersion
                             : impl_->recent_tokens   ? kRecentProfileVersion
                                                      : kProgressiveProfileVersion);
  w.put(impl_->hash);
  const std::vector<uint8_t> b = impl_->body();
  w.put(uint64_t(b.size()));
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

Result<Profile> Profile::load(std::span<const uint8_t> bytes) {
  ByteReader r(bytes, "codec profile");
  char magic[4];
  for (char& m : magic) m = char(r.get<uint8_t>());
  const uint32_t version = r.get<uint32_t>();
  const uint64_t hash = r.get<uint64_t>();
  const uint64_t body_size = r.get<uint64_t>();
  KVS_RETURN_IF_ERROR(r.status());
  if (std::memcmp(magic, kMagic, 4) != 0)
    return make_status(StatusCode::corrupt_data, "not a kvstream codec profile (bad magic)");
  if (version != kProfileVersion && version != kProgressiveProfileVersion && version != kRecentProfileVersion &&
      version != kRecentLeadProfileVersion)
    return make_status(StatusCode::unsupported, "codec profile version {} (this build reads {} to {})", version,
                       kProfileVersion, kRecentLeadProfileVersion);
  if (body_size != r.rest().size())
    return make_status(StatusCode::corrupt_data, "codec profile body is {} bytes, header says {}", r.rest().size(),
                       body_size);
  const std::span<const uint8_t> body = r.rest();
  if (XXH3_64bits(body.data(), body.size()) != hash)
    return make_status(StatusCode::corrupt_data, "codec profile content hash mismatch (corrupt or edited profile)");

  auto impl = std::make_unique<Impl>();
  Impl& p = *impl;
  ByteReader b(body, "codec profile body");
  p.geom.layers = b.get<uint32_t>(), p.geom.kv_heads = b.get<uint32_t>(), p.geom.head_dim = b.get<uint32_t>();
  p.geom.q_heads = b.get<uint32_t>(), p.geom.kind = AttentionKind(b.get<uint8_t>());
  const uint8_t rope_enabled = b.get<uint8_t>();
  p.rope.enabled = rope_enabled != 0, p.rope.base = b.get<float>(), p.rope.rotary_dim = b.get<uint32_t>();
  p.rope.pairing = RopePairing(b.get<uint8_t>());
  const uint8_t k_before = b.get<uint8_t>();
  p.k_before_rope = k_before != 0, p.group_size = b.get<uint32_t>();
  KVS_RETURN_IF_ERROR(b.status());
  if (rope_enabled > 1 || k_before > 1) return make_status(StatusCode::corrupt_data, "codec profile: bad flag byte");
  KVS_RETURN_IF_ERROR(p.geom.validate().with_context("codec profile"));
  const uint32_t rot = p.rope.rotary_dim ? p.rope.rotary_dim : p.geom.head_dim;
  if (uint8_t(p.rope.pairing) > 1 || !(p.rope.base > 1.0f) || p.rope.rotary_dim > p.geom.head_dim ||
      (p.rope.enabled && (rot < 2 || rot % 2 != 0)))
    return make_status(StatusCode::corrupt_data, "codec profile: bad RoPE parameters");
  if (p.k_before_rope && (p.rope.rotary_dim ? p.rope.rotary_dim : p.geom.head_dim) > 1024)
    return make_status(StatusCode::corrupt_data, "codec profile: RoPE over more than 1024 channels per head");
  if (p.group_size == 0 || p.group_size > 65535)
    return make_status(StatusCode::corrupt_data, "codec profile: group size {}", p.group_size);
  const size_t n = p.channels_total();
  if (n > (size_t(1) << 26)) return make_status(StatusCode::corrupt_data, "codec profile: {} channels", n);
  b.get_array(p.predictor, n), b.get_array(p.mean, n), b.get_array(p.step_scale, n);
  const size_t LP = size_t(p.geom.layers) * p.geom.planes();
  p.transform_block.resize(LP);
  p.transform.resize(LP);
  for (size_t lp = 0; lp < LP; ++lp) {
    const uint32_t B = b.get<uint32_t>();
    KVS_RETURN_IF_ERROR(b.status());
    if (B != 0 && (B > 1024 || p.geom.channels() % B != 0))
      return make_status(StatusCode::corrupt_data, "codec profile: transform block {} for {} channels", B,
                         p.geom.channels());
    p.transform_block[lp] = B;
    if (!B) continue;
    if (!b.get_array(p.transform[lp], size_t(p.geom.channels()) * B)) return b.status();
    for (float u : p.transform[lp])
      if (!(std::fabs(u) <= 1.0001f)) return make_status(StatusCode::corrupt_data, "codec profile: bad transform entry");
  }
  const uint32_t nlevels = b.get<uint32_t>();
  KVS_RETURN_IF_ERROR(b.status());
  for (size_t i = 0; i < n; ++i) {
    if (p.predictor[i] > uint8_t(Predictor::anchor))
      return make_status(StatusCode::corrupt_data, "codec profile: predictor {} of channel {}", p.predictor[i], i);
    if (!std::isfinite(p.mean[i]) || !(p.step_scale[i] > 0.0f) || !std::isfinite(p.step_scale[i]))
      return make_status(StatusCode::corrupt_data, "codec profile: bad mean or step of channel {}", i);
  }
  if (nlevels == 0 || nlevels > kMaxLevels)
    return make_status(StatusCode::corrupt_data, "codec profile: {} levels", nlevels);
  p.levels.resize(nlevels);
  for (Impl::Level& lv : p.levels) {
    lv.info.step = b.get<float>(), lv.info.bits_per_element = b.get<double>();
    lv.info.ppl_increase_pct = b.get<double>(), lv.info.kl_nats = b.get<double>();
    const uint32_t ntables = b.get<uint32_t>();
    KVS_RETURN_IF_ERROR(b.status());
    if (!(lv.info.step > 0.0f) || !std::isfinite(lv.info.step))
      return make_status(StatusCode::corrupt_data, "codec profile: bad level step");
    if (ntables == 0 || ntables > RANS_MAX_TABLES)
      return make_status(StatusCode::corrupt_data, "codec profile: {} tables in a level", ntables);
    for (uint32_t t = 0; t < ntables; ++t) {
      size_t used = 0;
      auto tab = FreqTable::deserialize(b.rest(), &used);
      if (!tab.ok()) return tab.status().with_context("codec profile table");
      lv.tables.push_back(std::move(tab).value());
      b.skip(used);
    }
    for (uint32_t r = 0; r < kRoles; ++r) {
      if (!b.get_array(lv.table_of[r], n)) return b.status();
      for (uint8_t id : lv.table_of[r])
        if (id >= ntables) return make_status(StatusCode::corrupt_data, "codec profile: table id {} >= {}", id, ntables);
    }
  }
  if (version == kProgressiveProfileVersion || version == kRecentProfileVersion ||
      version == kRecentLeadProfileVersion) {
    if (b.get<uint8_t>() != 1) return make_status(StatusCode::corrupt_data, "codec profile: bad progressive flag");
    p.progressive = true;
    for (Impl::Level& lv : p.levels) {
      lv.info.distortion = b.get<double>();
      if (!(lv.info.distortion >= 0 || lv.info.distortion == -1) || !std::isfinite(lv.info.distortion))
        return make_status(StatusCode::corrupt_data, "codec profile: bad level distortion");
    }
    if (version == kRecentProfileVersion || version == kRecentLeadProfileVersion) {
      p.recent_tokens = b.get<uint32_t>(), p.recent_layers = b.get<uint32_t>();
      if (b.ok() && (p.recent_tokens == 0 || p.recent_tokens > kMaxChunkTokens || p.recent_layers == 0 ||
                     p.recent_layers >= nlevels))
        return make_status(StatusCode::corrupt_data, "codec profile: recent window of {} tokens, {} layers",
                           p.recent_tokens, p.recent_layers);
      if (version == kRecentLeadProfileVersion) {
        if (b.get<uint8_t>() != 1) return make_status(StatusCode::corrupt_data, "codec profile: bad recent lead flag");
        p.recent_lead = true;
      }
    }
    if (nlevels > kMaxProgressiveLayers)
      return make_status(StatusCode::corrupt_data, "codec profile: {} progressive layers (at most {})", nlevels,
                         kMaxProgressiveLayers);
    for (size_t i = 0; i < n; ++i)
      if (p.predictor[i] == uint8_t(Predictor::anchor))
        return make_status(StatusCode::corrupt_data, "codec profile: anchor predictor in a progressive profile");
  }
  KVS_RETURN_IF_ERROR(b.status());
  if (!b.rest().empty()) return make_status(StatusCode::corrupt_data, "codec profile: {} trailing bytes", b.rest().size());
  KVS_RETURN_IF_ERROR(p.finalize());
  if (p.hash != hash) return make_status(StatusCode::internal, "codec profile re-hash differs");
  return Profile(std::move(impl));
}

Result<Profile> Profile::load_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_status(StatusCode::not_found, "cannot open codec profile '{}'", path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto p = load(bytes);
  if (!p.ok()) return p.status().with_context(path);
  return p;
}

Status Profile::save_file(const std::string& path) const {
  const std::vector<uint8_t> bytes = serialize();
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_status(StatusCode::io_error, "cannot create '{}': {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return make_status(StatusCode::io_error, "cannot write '{}': {}", tmp, std::strerror(e));
    }
    done += size_t(n);
  }
  // Durability: the data reaches the disk before the name points at it.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return make_status(StatusCode::io_error, "cannot sync '{}': {}", tmp, std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return make_status(StatusCode::io_error, "cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno));
  }
  return {};
}

}  // namespace kvstream::codec
