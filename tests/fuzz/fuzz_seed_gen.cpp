// Writes seed corpora for the codec fuzz targets:
//   fuzz_seed_gen <dir>  ->  <dir>/fuzz_chunk_decoder/*, <dir>/fuzz_profile_loader/*, <dir>/fuzz_rans_decoder/*
// Chunk seeds: valid chunks of each fuzz profile (several levels, token counts,
// dtypes, positions, one with outliers), each framed with a few control bytes; for the
// progressive profile each level's prefix of the stream, behind selectors that cut it
// at a prefix point or anywhere and refine across a split (fuzz_common.hpp), and one
// longer chunk whose refinement layers have two plane groups (prefix points inside a
// layer).
// Profile seeds: the serialized fuzz profiles, framed likewise.
// Wire seeds (<dir>/fuzz_wire_protocol): every request and response kind (a put with
// and without a parts table, a get of a whole object and of a range), stat bodies with
// and without parts and list bodies, each behind the byte that picks the parser.
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "storage/protocol.hpp"

using namespace kvstream;

// Writes ctl, then `prefix` (the progressive profile's selectors), then `body`.
static bool write_file(const std::string& path, uint8_t ctl, const std::vector<uint8_t>& prefix,
                       const std::vector<uint8_t>& body) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(&ctl, 1, 1, f) == 1 && std::fwrite(prefix.data(), 1, prefix.size(), f) == prefix.size() &&
            std::fwrite(body.data(), 1, body.size(), f) == body.size();
  return std::fclose(f) == 0 && ok;
}

static bool write_file(const std::string& path, uint8_t ctl, const std::vector<uint8_t>& body) {
  return write_file(path, ctl, {}, body);
}

static std::vector<uint8_t> selectors(uint16_t cut, uint16_t split) {
  return {uint8_t(cut), uint8_t(cut >> 8), uint8_t(split), uint8_t(split >> 8)};
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output dir>\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  const std::string cdir = root + "/fuzz_chunk_decoder", pdir = root + "/fuzz_profile_loader";
  ::mkdir(root.c_str(), 0755), ::mkdir(cdir.c_str(), 0755), ::mkdir(pdir.c_str(), 0755);
  const std::vector<codec::Profile> profiles = fuzz::build_profiles();
  int n = 0, grouped = 0;
  for (size_t pi = 0; pi < profiles.size(); ++pi) {
    const codec::Profile& p = profiles[pi];
    const fuzz::ProfileSpec& spec = fuzz::profile_specs()[pi];
    std::fprintf(stderr, "profile %zu: %016llx\n", pi, (unsigned long long)p.hash());
    for (uint32_t level = 0; level < p.levels(); ++level)
      for (uint64_t tokens : {1u, 6u, 13u}) {
        const DType dt = DType((level + tokens) % 3);
        KvCache c = fuzz::synthetic_cache(spec.geom, spec.rope, dt, tokens, 40 * level + tokens, 1000 + n);
        if (tokens == 13) c.set(0, p.geometry().planes() - 1, 4, 1, 3000.0f);  // an outlier
        std::vector<uint8_t> chunk;
        const Status st = codec::encode_chunk(p, c.view(), level, chunk);
        if (!st.ok()) {
          std::fprintf(stderr, "encode: %s\n", st.to_string().c_str());
          return 1;
        }
        // Control: this profile; reseal on odd seeds; vary dtype, paged, parallel, scratch.
        const uint8_t ctl = uint8_t(pi | ((n & 1) << 2) | ((n % 3) << 3) | ((n & 2) << 4) | ((n & 4) << 4) |
                                    ((n & 8) << 4));
        // Progressive: cut whole / at a prefix point / anywhere / from the end, and
        // refine from the base, from another point or from anywhere.
        const uint16_t cuts[4] = {0x0000, uint16_t(0x4000 | (n % 3)), uint16_t(0x8000 | (n * 37)),
                                  uint16_t(0xc000 | (n * 5))};
        const uint16_t splits[4] = {0x4000, uint16_t(0x4000 | (n % 2)), 0x0000, uint16_t(0x8000 | (n * 53))};
        const std::vector<uint8_t> sel = p.progressive() ? selectors(cuts[n % 4], splits[(n / 4) % 4])
                                                         : std::vector<uint8_t>{};
        if (!write_file(cdir + "/seed_" + std::to_string(n++), ctl, sel, chunk)) return 1;
      }
    if (p.progressive()) {
      // Two plane groups per refinement layer: prefix points base, (layer 1: group 0,
      // group 1), (layer 2: group 0, group 1), and with recent rows that lead the
      // layers' lead substreams before their groups. Cut at each point, refine across
      // others. The chunk ends its context: its last rows are recent (the base carries
      // their first refinement layer).
      const uint64_t T = fuzz::kProgressiveGroupedTokens;
      const KvCache c = fuzz::synthetic_cache(spec.geom, spec.rope, DType::bf16, T, 4096, 5000);
      std::vector<uint8_t> chunk;
      if (Status st = codec::encode_chunk(p, c.view(), 0, codec::EncodeOptions{codec::recent_tokens_of(p, {0, T}, T)},
                                          chunk);
          !st.ok()) {
        std::fprintf(stderr, "encode: %s\n", st.to_string().c_str());
        return 1;
      }
      const auto points = codec::chunk_prefixes(chunk);
      const size_t lead_layers = p.recent_lead() ? fuzz::kProgressiveLayers - 1 - p.recent_layers() : 0;
      if (!points.ok() || points->size() != 1 + (fuzz::kProgressiveLayers - 1 + lead_layers) * 2) {
        std::fprintf(stderr, "the grouped progressive seed has %zu prefix points, not two groups per layer\n",
                     points.ok() ? points->size() : 0);
        return 1;
      }
      std::fprintf(stderr, "grouped progressive seed: %zu bytes, %zu prefix points\n", chunk.size(), points->size());
      const std::pair<uint16_t, uint16_t> sels[] = {{0x0000, 0x4001}, {0x4003, 0x4002}, {0x4001, 0x4000},
                                                    {0x4004, 0x4003}, {0x4002, 0x8000 | 999}};
      int k = 0;
      for (const auto& [cut, split] : sels) {
        const uint8_t ctl = uint8_t(pi | ((k & 1) << 2) | ((k % 3) << 3) | ((k & 2) << 4) | ((k & 4) << 4));
        if (!write_file(cdir + "/grouped_" + std::to_string(k++), ctl, selectors(cut, split), chunk)) return 1;
      }
      grouped += k;
    }
    const std::vector<uint8_t> ser = p.serialize();
    for (uint8_t ctl : {0, 1, 3})
      if (!write_file(pdir + "/profile_" + std::to_string(pi) + "_" + std::to_string(ctl), ctl, ser)) return 1;
  }
  // Wire seeds.
  const std::string wdir = root + "/fuzz_wire_protocol";
  ::mkdir(wdir.c_str(), 0755);
  auto bytes = [](const std::vector<std::byte>& b) {
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(b.data()), reinterpret_cast<const uint8_t*>(b.data()) + b.size());
  };
  int w = 0;
  using storage::Op;
  for (Op op : {Op::hello, Op::auth, Op::put, Op::get, Op::stat, Op::remove, Op::list, Op::data, Op::touch,
                Op::usage}) {
    storage::Request rq;
    rq.op = op;
    rq.id = 1000 + w;
    rq.chunk = 7;
    rq.level = 3;
    if (op == Op::put || op == Op::get || op == Op::stat || op == Op::remove) rq.context = "story-0042";
    if (op == Op::auth) rq.name_space = "tenant-a", rq.mac.fill(0x5a);
    if (op == Op::put) rq.total = 3 << 20, rq.checksum = 0x1122334455667788ull, rq.version = 1700000000000000ull;
    if (op == Op::touch) rq.total = 300, rq.checksum = 0x1122334455667788ull, rq.version = 1700000000000000ull;
    if (op == Op::usage) rq.context = "story-", rq.after = "story-0041", rq.chunk = 4096;
    if (!write_file(wdir + "/req_" + std::to_string(w++), 0, bytes(storage::encode(rq)))) return 1;
    if (op == Op::put) {  // with a parts table (a progressive chunk's levels)
      rq.parts = {{1000, 2.5}, {200000, 0.25}, {3 << 20, 0.0}};
      if (!write_file(wdir + "/req_" + std::to_string(w++), 0, bytes(storage::encode(rq)))) return 1;
    }
    if (op == Op::get) {  // a range get
      rq.range_offset = 1000, rq.range_length = 199000;
      if (!write_file(wdir + "/req_" + std::to_string(w++), 0, bytes(storage::encode(rq)))) return 1;
    }
    if (op == Op::stat) {  // asking for write versions
      rq.flags = storage::kStatVersions;
      if (!write_file(wdir + "/req_" + std::to_string(w++), 0, bytes(storage::encode(rq)))) return 1;
    }
    if (op == Op::remove) {  // up to a version, and a batch of removes
      rq.flags = storage::kRemoveUpTo, rq.version = 1765000000000000;
      if (!write_file(wdir + "/req_" + std::to_string(w++), 0, bytes(storage::encode(rq)))) return 1;
      rq.flags = storage::kRemoveBatch, rq.version = 0, rq.context.clear();
      rq.total = 300, rq.checksum = 0x1122334455667788ull;
      if (!write_file(wdir + "/req_" + std::to_string(w++), 0, bytes(storage::encode(rq)))) return 1;
    }
    if (op != Op::hello && op != Op::auth && op != Op::data) {  // naming the client's member set (kMembersRevision)
      storage::Request m = rq;
      m.flags |= storage::kMembersRevision, m.members_revision = 4711;
      if (!write_file(wdir + "/req_" + std::to_string(w++), 0, bytes(storage::encode(m)))) return 1;
    }
    storage::Response rs;
    rs.op = op;
    rs.id = rq.id;
    rs.checksum = 0x0123456789abcdefull;
    if (op == Op::hello) rs.nonce.fill(0x33), rs.features = storage::kFeatureUsage | storage::kFeatureVersions, rs.checksum = 0;
    if (op == Op::get) rs.code = StatusCode::not_found, rs.message = "no such chunk", rs.members_newer = true;
    if (op == Op::data) rs.total = 0;
    if (!write_file(wdir + "/resp_" + std::to_string(w++), 1, bytes(storage::encode(rs)))) return 1;
  }
  if (!write_file(wdir + "/stats", 2, bytes(storage::encode_stats({{0, {100, 50, 0}}, {1, {90, 40, 20}}})))) return 1;
  {
    storage::ChunkStat a{0, {4000, 0, 300}, {{{100, 1.5}, {1000, 0.5}, {4000, 0.0}}, {}, {{300, 7.0}}}};
    storage::ChunkStat b{3, {0, 90}, {{}, {{90, 0.125}}}};
    if (!write_file(wdir + "/stats_parts", 2, bytes(storage::encode_stats({a, b})))) return 1;
    // With write versions: selector 8 is a stat body (8 mod 6 = 2) read with them (8 / 6 odd).
    a.level_versions = {1700000000000001ull, 0, 1700000000000002ull}, b.level_versions = {0, 5};
    if (!write_file(wdir + "/stats_versions", 8, bytes(storage::encode_stats({a, b}, true)))) return 1;
  }
  if (!write_file(wdir + "/names", 3, bytes(storage::encode_names({"a", "story-1", "ctx.v2"})))) return 1;
  {
    // Selector 9 is a batch of removes' body (9 mod 6 = 3, 9 / 6 odd).
    const std::vector<storage::ContextRemove> removes = {{"story-0", 1765000000000000}, {"story-1", 7}};
    if (!write_file(wdir + "/removes", 9, bytes(storage::encode_removes(removes)))) return 1;
  }
  {
    const std::vector<storage::ContextTouch> touches = {{"story-0", 0}, {"story-1", 1}, {"story-2", 2}};
    if (!write_file(wdir + "/touches", 4, bytes(storage::encode_touches(touches)))) return 1;
    const std::vector<storage::ContextUsage> usage = {{"story-0", 4000, {0, 1}, 17, 99, 0}, {"story-1", 9, {3}, 5, 0, 0}};
    if (!write_file(wdir + "/usage", 5, bytes(storage::encode_usage(usage)))) return 1;
  }
  // rANS seeds (fuzz_rans_decoder): its input is a description, not a stream, so a
  // few descriptions are enough: untouched matrices of every shape kind, and groups
  // with edits.
  const std::string rdir = root + "/fuzz_rans_decoder";
  ::mkdir(rdir.c_str(), 0755);
  const std::vector<std::vector<uint8_t>> rans_seeds = {
      {0, 5, 0, 3, 1, 2, 3, 4},                                              // one wide matrix, table 0
      {3, 7, 200, 40, 9, 9, 9, 9, 7, 1, 8, 5, 5, 5, 5, 9, 2, 16, 1, 2, 3, 4, 9, 255, 90, 7, 7, 7, 7},  // four wide
      {5, 0, 3, 1, 1, 1, 1, 1, 1, 4, 1, 2, 2, 2, 2, 2, 8, 3, 3, 3, 3, 3, 3, 10, 4, 4, 4, 4, 4, 5, 6, 5, 5, 5, 5, 5,
       6, 200, 5, 6, 6, 6, 6, 0, 77, 0, 0, 0, 1, 8, 200, 0, 0, 0, 3, 6, 9, 0, 0, 0, 0, 15, 1, 0, 0, 0, 64},  // six, edited
      {0x80, 5, 0, 3, 1, 2, 3, 4, 0, 0, 2, 9, 9, 9, 9, 0, 0, 1, 7, 7, 7, 7},  // a chain of three, 2048 wide
      {0x8b, 9, 0, 40, 5, 5, 5, 5, 0, 0, 30, 8, 8, 8, 8, 1, 2, 40, 3, 3, 3, 3},  // a chain of two, 20480 wide, edited
  };
  for (size_t i = 0; i < rans_seeds.size(); ++i)
    if (!write_file(rdir + "/seed_" + std::to_string(i), rans_seeds[i][0], {rans_seeds[i].begin() + 1, rans_seeds[i].end()}))
      return 1;
  std::fprintf(stderr, "wrote %d chunk seeds, %zu profile seeds and %d wire seeds under %s\n", n + grouped, profiles.size() * 3,
               w + 5, root.c_str());
  return 0;
}
