// libFuzzer target: the storage protocol's parsers on untrusted bytes: request and
// response headers, stat bodies and list bodies (the first input byte picks which).
// Invariants besides memory safety: a parser never returns `internal`, and whatever
// it accepts re-encodes to bytes it parses back to the same fields (nothing accepted
// is lost or invented on the way).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "storage/protocol.hpp"

using namespace kvstream;
using namespace kvstream::storage;

namespace {
[[noreturn]] void fail(const char* what, const Status& st = {}) {
  std::fprintf(stderr, "fuzz_wire_protocol: invariant broken: %s %s\n", what, st.to_string().c_str());
  std::abort();
}
template <typename T>
void no_internal(const Result<T>& r, const char* what) {
  if (!r.ok() && r.status().code() == StatusCode::internal) fail(what, r.status());
}
bool same(const Request& a, const Request& b) {
  return a.op == b.op && a.id == b.id && a.chunk == b.chunk && a.level == b.level && a.context == b.context &&
         a.name_space == b.name_space && a.mac == b.mac;
}
bool same(const Response& a, const Response& b) {
  return a.op == b.op && a.id == b.id && a.code == b.code && a.message == b.message && a.checksum == b.checksum &&
         a.nonce == b.nonce;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto in = std::as_bytes(std::span(data + 1, size - 1));
  switch (data[0] % 4) {
    case 0: {
      auto r = decode_request(in);
      no_internal(r, "decode_request");
      if (r.ok()) {
        auto again = decode_request(encode(*r));
        if (!again.ok() || !same(*r, *again)) fail("request round trip", again.status());
      }
      break;
    }
    case 1: {
      auto r = decode_response(in);
      no_internal(r, "decode_response");
      if (r.ok()) {
        auto again = decode_response(encode(*r));
        if (!again.ok() || !same(*r, *again)) fail("response round trip", again.status());
      }
      break;
    }
    case 2: {
      auto r = decode_stats(in);
      no_internal(r, "decode_stats");
      if (r.ok()) {
        auto again = decode_stats(encode_stats(*r));
        if (!again.ok() || *again != *r) fail("stats round trip", again.status());
      }
      break;
    }
    default: {
      auto r = decode_names(in);
      no_internal(r, "decode_names");
      if (r.ok()) {
        auto again = decode_names(encode_names(*r));
        if (!again.ok() || *again != *r) fail("names round trip", again.status());
      }
      break;
    }
  }
  return 0;
}
