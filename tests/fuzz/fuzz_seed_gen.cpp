// Writes seed corpora for the codec fuzz targets:
//   fuzz_seed_gen <dir>  ->  <dir>/fuzz_chunk_decoder/*, <dir>/fuzz_profile_loader/*
// Chunk seeds: valid chunks of each fuzz profile (several levels, token counts,
// dtypes, positions, one with outliers), each framed with a few control bytes.
// Profile seeds: the serialized fuzz profiles, framed likewise.
// Wire seeds (<dir>/fuzz_wire_protocol): every request and response kind, stat and
// list bodies, each behind the byte that picks the parser.
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "storage/protocol.hpp"

using namespace kvstream;

static bool write_file(const std::string& path, uint8_t ctl, const std::vector<uint8_t>& body) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(&ctl, 1, 1, f) == 1 && std::fwrite(body.data(), 1, body.size(), f) == body.size();
  return std::fclose(f) == 0 && ok;
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
  int n = 0;
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
        if (!write_file(cdir + "/seed_" + std::to_string(n++), ctl, chunk)) return 1;
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
  for (Op op : {Op::hello, Op::auth, Op::put, Op::get, Op::stat, Op::remove, Op::list, Op::data}) {
    storage::Request rq;
    rq.op = op;
    rq.id = 1000 + w;
    rq.chunk = 7;
    rq.level = 3;
    if (op == Op::put || op == Op::get || op == Op::stat || op == Op::remove) rq.context = "story-0042";
    if (op == Op::auth) rq.name_space = "tenant-a", rq.mac.fill(0x5a);
    if (op == Op::put) rq.total = 3 << 20, rq.checksum = 0x1122334455667788ull, rq.version = 1700000000000000ull;
    if (!write_file(wdir + "/req_" + std::to_string(w++), 0, bytes(storage::encode(rq)))) return 1;
    storage::Response rs;
    rs.op = op;
    rs.id = rq.id;
    rs.checksum = 0x0123456789abcdefull;
    if (op == Op::hello) rs.nonce.fill(0x33);
    if (op == Op::get) rs.code = StatusCode::not_found, rs.message = "no such chunk";
    if (op == Op::data) rs.total = 0;
    if (!write_file(wdir + "/resp_" + std::to_string(w++), 1, bytes(storage::encode(rs)))) return 1;
  }
  if (!write_file(wdir + "/stats", 2, bytes(storage::encode_stats({{0, {100, 50, 0}}, {1, {90, 40, 20}}})))) return 1;
  if (!write_file(wdir + "/names", 3, bytes(storage::encode_names({"a", "story-1", "ctx.v2"})))) return 1;
  std::fprintf(stderr, "wrote %d chunk seeds, %zu profile seeds and %d wire seeds under %s\n", n, profiles.size() * 3,
               w + 2, root.c_str());
  return 0;
}
