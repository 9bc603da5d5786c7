// tinyput: how many objects of BYTES bytes a tenant can store under its quota on a
// running kvstream-server, one context per object (as KvStore stores a chunk), until
// the node answers no_space or LIMIT objects are stored. run.sh measures the disk the
// tenant's directory then takes, against the quota.
// Usage: tinyput ADDRESS SECRET BYTES LIMIT
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvstream/kvstream.hpp"

using namespace kvstream;

int main(int argc, char** argv) {
  if (argc != 5) return std::fprintf(stderr, "usage: tinyput ADDRESS SECRET BYTES LIMIT\n"), 2;
  set_log_level(LogLevel::warn);
  storage::ClientConfig cc;
  cc.address = argv[1], cc.name_space = "ns", cc.secret = argv[2];
  auto c = storage::Client::connect(cc, transport::deadline_in(std::chrono::seconds(10)));
  if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().to_string().c_str()), 1;
  const std::vector<std::byte> body(std::strtoull(argv[3], nullptr, 10), std::byte{7});
  const uint64_t limit = std::strtoull(argv[4], nullptr, 10);
  uint64_t stored = 0;
  for (; stored < limit; ++stored) {
    const Status s = (*c)->put("ctx-" + std::to_string(stored), 0, 0, body, transport::deadline_in(std::chrono::seconds(10)));
    if (s.code() == StatusCode::no_space) break;
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
  }
  std::printf("%llu\n", static_cast<unsigned long long>(stored));
  return 0;
}
