#include "tests/checker/history.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

namespace kvstream::checker {

namespace {
// Writes of one key that were acknowledged, by return ticket, with the latest start
// among those returned so far.
struct AckedWrites {
  std::vector<std::pair<uint64_t, uint64_t>> by_return;  // (returned, max invoked up to here)
  void finish() {
    std::sort(by_return.begin(), by_return.end());
    uint64_t m = 0;
    for (auto& [ret, inv] : by_return) m = std::max(m, inv), inv = m;
  }
  // The latest start of a write acknowledged before `ticket` (0: none).
  [[nodiscard]] uint64_t latest_start_before(uint64_t ticket) const {
    auto it = std::lower_bound(by_return.begin(), by_return.end(), std::make_pair(ticket, uint64_t(0)));
    return it == by_return.begin() ? 0 : std::prev(it)->second;
  }
};
}  // namespace

std::vector<Anomaly> check(const std::vector<Operation>& h) {
  std::vector<Anomaly> out;
  std::unordered_map<uint64_t, size_t> puts;        // put id -> op
  std::map<uint32_t, AckedWrites> acked;            // key -> acknowledged writes
  std::map<uint32_t, std::vector<uint32_t>> keys_of;  // context -> its keys
  // Removes of each context that may have taken effect: (invoked, returned).
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> removes;
  for (size_t i = 0; i < h.size(); ++i) {
    const Operation& o = h[i];
    auto& ks = keys_of[o.context];
    if (std::find(ks.begin(), ks.end(), o.key) == ks.end() && o.kind != Kind::remove) ks.push_back(o.key);
    if (o.kind == Kind::put) puts[o.put_id] = i;
  }
  for (size_t i = 0; i < h.size(); ++i) {
    const Operation& o = h[i];
    if (o.kind == Kind::put && o.outcome == Outcome::ok) acked[o.key].by_return.emplace_back(o.returned, o.invoked);
    if (o.kind == Kind::remove && o.outcome != Outcome::failed) {
      removes[o.context].emplace_back(o.invoked, o.returned);
      if (o.outcome == Outcome::ok)
        for (uint32_t k : keys_of[o.context]) acked[k].by_return.emplace_back(o.returned, o.invoked);
    }
  }
  for (auto& [k, w] : acked) w.finish();
  for (auto& [c, r] : removes) std::sort(r.begin(), r.end());

  for (size_t i = 0; i < h.size(); ++i) {
    const Operation& r = h[i];
    if (r.kind != Kind::get || r.outcome != Outcome::ok) continue;
    if (r.corrupt) {
      out.push_back({i, "the node served or reported a corrupt object"});
      continue;
    }
    if (r.torn) {
      out.push_back({i, "the bytes read are not one put's whole value"});
      continue;
    }
    const auto ak = acked.find(r.key);
    const uint64_t must_follow = ak == acked.end() ? 0 : ak->second.latest_start_before(r.invoked);
    if (r.put_id != 0) {
      auto p = puts.find(r.put_id);
      if (p == puts.end()) {
        out.push_back({i, fmt::format("read put {} that was never issued", r.put_id)});
        continue;
      }
      const Operation& w = h[p->second];
      if (w.key != r.key) out.push_back({i, fmt::format("read put {} of key {} under key {}", r.put_id, w.key, r.key)});
      else if (w.outcome == Outcome::failed) out.push_back({i, fmt::format("read put {}, which was refused", r.put_id)});
      else if (w.invoked > r.returned) out.push_back({i, fmt::format("read put {} before it was issued", r.put_id)});
      else if (must_follow > w.returned)
        out.push_back({i, fmt::format("read put {}, but a write acknowledged before the read began started after it "
                                      "ended: an acknowledged write is lost",
                                      r.put_id)});
      continue;
    }
    // Nothing found: the initial state, or a remove that may have taken effect by the
    // time the read returned, must be at least as late as every acknowledged write.
    uint64_t latest_remove_end = 0;
    for (const auto& [inv, ret] : removes[r.context])
      if (inv < r.returned) latest_remove_end = std::max(latest_remove_end, ret);
    if (must_follow > latest_remove_end)
      out.push_back({i, "read nothing, but an acknowledged put is not explained away by any remove"});
  }
  return out;
}

}  // namespace kvstream::checker
