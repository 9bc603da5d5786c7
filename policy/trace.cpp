// Link traces: validation, rate lookup, transfer completion, text parsing.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <string>

#include "kvstream/policy.hpp"

namespace kvstream::policy {

Status LinkTrace::validate() const {
  if (segments.empty()) return make_status(StatusCode::invalid_argument, "link trace: no segments");
  if (!std::isfinite(latency_s) || latency_s < 0)
    return make_status(StatusCode::invalid_argument, "link trace: latency {} s is not a finite value >= 0", latency_s);
  if (segments.front().start_s != 0)
    return make_status(StatusCode::invalid_argument, "link trace: first segment starts at {} s, not 0",
                       segments.front().start_s);
  for (size_t i = 0; i < segments.size(); ++i) {
    const auto& s = segments[i];
    if (!std::isfinite(s.start_s) || !std::isfinite(s.bits_per_second) || s.bits_per_second < 0)
      return make_status(StatusCode::invalid_argument, "link trace: segment {} (start {} s, rate {} bit/s) is invalid",
                         i, s.start_s, s.bits_per_second);
    if (i > 0 && !(s.start_s > segments[i - 1].start_s))
      return make_status(StatusCode::invalid_argument, "link trace: segment {} starts at {} s, not after segment {}",
                         i, s.start_s, i - 1);
  }
  if (!(segments.back().bits_per_second > 0))
    return make_status(StatusCode::invalid_argument, "link trace: the last segment's rate must be > 0");
  return {};
}

namespace {
size_t segment_index(const std::vector<RateSegment>& segs, double t) {
  auto it = std::upper_bound(segs.begin(), segs.end(), t,
                             [](double v, const RateSegment& s) { return v < s.start_s; });
  return it == segs.begin() ? 0 : size_t(it - segs.begin()) - 1;
}
}  // namespace

double LinkTrace::rate_at(double t) const noexcept {
  if (segments.empty()) return 0;
  return segments[segment_index(segments, t)].bits_per_second;
}

Result<double> LinkTrace::transfer_end(double start_s, uint64_t bytes) const {
  KVS_RETURN_IF_ERROR(validate());
  if (!std::isfinite(start_s) || start_s < 0)
    return make_status(StatusCode::invalid_argument, "transfer start {} s is not a finite time >= 0", start_s);
  if (bytes == 0) return make_status(StatusCode::invalid_argument, "transfer of zero bytes");
  double t = start_s + latency_s;
  double bits = double(bytes) * 8.0;
  for (size_t i = segment_index(segments, t);; ++i) {
    const double rate = segments[i].bits_per_second;
    const double seg_end =
        i + 1 < segments.size() ? segments[i + 1].start_s : std::numeric_limits<double>::infinity();
    if (rate > 0) {
      const double cap = (seg_end - t) * rate;
      if (cap >= bits) return t + bits / rate;
      bits -= cap;
    }
    t = seg_end;
  }
}

Result<LinkTrace> parse_trace(std::string_view text) {
  LinkTrace trace;
  size_t line_no = 0;
  auto parse_num = [](std::string_view tok, double& out) {
    // from_chars for double is in libstdc++ >= 11; strtod keeps us portable.
    std::string s(tok);
    char* end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return !s.empty() && end == s.c_str() + s.size();
  };
  while (!text.empty()) {
    ++line_no;
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string_view> toks;
    size_t p = 0;
    while (p < line.size()) {
      while (p < line.size() && std::isspace(static_cast<unsigned char>(line[p]))) ++p;
      size_t q = p;
      while (q < line.size() && !std::isspace(static_cast<unsigned char>(line[q]))) ++q;
      if (q > p) toks.push_back(line.substr(p, q - p));
      p = q;
    }
    if (toks.empty()) continue;
    if (toks.size() != 2)
      return make_status(StatusCode::invalid_argument, "trace line {}: expected two fields, got {}", line_no,
                         toks.size());
    double v = 0;
    if (toks[0] == "latency") {
      if (!parse_num(toks[1], v))
        return make_status(StatusCode::invalid_argument, "trace line {}: bad latency '{}'", line_no, toks[1]);
      trace.latency_s = v;
      continue;
    }
    RateSegment seg;
    if (!parse_num(toks[0], seg.start_s) || !parse_num(toks[1], seg.bits_per_second))
      return make_status(StatusCode::invalid_argument, "trace line {}: expected '<start_s> <bits_per_second>'",
                         line_no);
    trace.segments.push_back(seg);
  }
  KVS_RETURN_IF_ERROR(trace.validate());
  return trace;
}

}  // namespace kvstream::policy
