// Writes seed corpora for the codec fuzz targets:
//   fuzz_seed_gen <dir>  ->  <dir>/fuzz_chunk_decoder/*, <dir>/fuzz_profile_loader/*
// Chunk seeds: valid chunks of each fuzz profile (several levels, token counts,
// dtypes, positions, one with outliers), each framed with a few control bytes.
// Profile seeds: the serialized fuzz profiles, framed likewise.
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_common.hpp"

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
  std::fprintf(stderr, "wrote %d chunk seeds and %zu profile seeds under %s\n", n, profiles.size() * 3, root.c_str());
  return 0;
}
