// The node's remembered removes (tombstones.hpp).
#include "storage/node/tombstones.hpp"

#include "core/log.hpp"

namespace kvstream::storage {

namespace {
int64_t unix_ms(Tombstones::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
}  // namespace

Tombstones::Tombstones(Limits limits, Now now) : now_(std::move(now)), limits_(limits) {}

Status Tombstones::persist_to(const std::string& path) {
  std::lock_guard log_lock(log_mu_);
  std::vector<TombstoneRecord> records;
  KVS_ASSIGN_OR_RETURN(TombstoneLog log, TombstoneLog::open(path, records));
  std::lock_guard lock(mu_);
  for (auto& r : records) {
    const auto at = Clock::time_point(std::chrono::milliseconds(r.unix_ms));
    if (r.horizon()) forget_locked(r.ns, at);
    else put_locked({std::move(r.ns), std::move(r.ctx)}, r.version, at);
  }
  log_.emplace(std::move(log));
  if (!records.empty()) KVS_LOG_INFO("{} removes remembered from '{}'", entries_.size(), path);
  return {};
}

void Tombstones::set_limits(Limits limits) {
  std::lock_guard log_lock(log_mu_);
  std::vector<TombstoneRecord> snapshot;
  {
    std::lock_guard lock(mu_);
    limits_ = limits;
    expire_locked();
    if (!compaction_due_locked()) return;
    snapshot = records_locked();
  }
  (void)log_->rewrite(snapshot);  // logged; the longer file is read back alike
}

Status Tombstones::record(const std::string& ns, const std::string& ctx, uint64_t version) {
  const ContextRemove one{ctx, version};
  return record_many(ns, std::span(&one, 1));
}

Status Tombstones::record_many(const std::string& ns, std::span<const ContextRemove> removes) {
  std::lock_guard log_lock(log_mu_);
  std::vector<TombstoneRecord> records, snapshot;
  bool compact = false;
  {
    std::lock_guard lock(mu_);
    if (limits_.max_entries == 0 || limits_.ttl.count() <= 0) return {};
    const auto now = now_();
    for (const ContextRemove& r : removes) {
      const Entry& e = put_locked({ns, r.context}, r.version, now);
      records.push_back({ns, r.context, e.version, unix_ms(now)});
    }
    expire_locked();
    if (!log_) return {};
    compact = compaction_due_locked();
    if (compact) snapshot = records_locked();
  }
  return compact ? log_->rewrite(snapshot) : log_->append(records);
}

uint64_t Tombstones::removed_up_to(const std::string& ns, const std::string& ctx) {
  std::lock_guard lock(mu_);
  expire_locked();
  const auto it = entries_.find(Key{ns, ctx});
  return it == entries_.end() ? 0 : it->second.version;
}

std::vector<std::pair<std::string, uint64_t>> Tombstones::list(const std::string& ns) {
  std::lock_guard lock(mu_);
  expire_locked();
  std::vector<std::pair<std::string, uint64_t>> out;
  for (auto it = entries_.lower_bound(Key{ns, std::string()}); it != entries_.end() && it->first.first == ns; ++it)
    out.emplace_back(it->first.second, it->second.version);
  return out;
}

size_t Tombstones::size() {
  std::lock_guard lock(mu_);
  expire_locked();
  return entries_.size();
}

std::optional<Tombstones::Clock::time_point> Tombstones::complete_since(const std::string& ns) {
  std::lock_guard lock(mu_);
  if (limits_.max_entries == 0 || limits_.ttl.count() <= 0) return std::nullopt;
  expire_locked();
  const auto since = now_() - limits_.ttl;
  const auto f = forgotten_.find(ns);
  return f == forgotten_.end() ? since : std::max(since, f->second);
}

Tombstones::Entry& Tombstones::put_locked(Key key, uint64_t version, Clock::time_point at) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    auto& mine = by_ns_[key.first];
    ages_.push_back(key), mine.push_back(key);
    return entries_.emplace(std::move(key), Entry{version, at, std::prev(ages_.end()), std::prev(mine.end())})
        .first->second;
  }
  Entry& e = it->second;
  e.version = std::max(e.version, version);
  e.at = std::max(e.at, at);
  ages_.splice(ages_.end(), ages_, e.age);
  auto& mine = by_ns_[key.first];
  mine.splice(mine.end(), mine, e.ns_age);
  return e;
}

void Tombstones::erase_locked(std::map<Key, Entry>::iterator it) {
  ages_.erase(it->second.age);
  const auto ns = by_ns_.find(it->first.first);
  ns->second.erase(it->second.ns_age);
  if (ns->second.empty()) by_ns_.erase(ns);
  entries_.erase(it);
}

void Tombstones::expire_locked() {
  const auto now = now_();
  while (!ages_.empty()) {
    const auto it = entries_.find(ages_.front());
    if (it->second.at + limits_.ttl > now) break;
    erase_locked(it);
  }
  // Over the bound: the oldest of the namespace that holds the most (a few tenants:
  // the scan is short, and runs only past the bound).
  while (entries_.size() > limits_.max_entries) {
    auto most = by_ns_.begin();
    for (auto n = by_ns_.begin(); n != by_ns_.end(); ++n)
      if (n->second.size() > most->second.size()) most = n;
    const auto it = entries_.find(most->second.front());
    forget_locked(it->first.first, it->second.at);
    erase_locked(it);
  }
  // A horizon older than ttl says no more than the age bound does.
  std::erase_if(forgotten_, [&](const auto& f) { return f.second + limits_.ttl <= now; });
}

void Tombstones::forget_locked(const std::string& ns, Clock::time_point at) {
  auto& horizon = forgotten_[ns];
  horizon = std::max(horizon, at);
}

bool Tombstones::compaction_due_locked() const {
  return log_ && log_->lines() > 2 * entries_.size() + 1024;
}

std::vector<TombstoneRecord> Tombstones::records_locked() const {
  std::vector<TombstoneRecord> out;
  out.reserve(forgotten_.size() + entries_.size());
  for (const auto& [ns, at] : forgotten_) out.push_back({ns, TombstoneRecord::kForgotten, 0, unix_ms(at)});
  for (const Key& k : ages_) {
    const Entry& e = entries_.at(k);
    out.push_back({k.first, k.second, e.version, unix_ms(e.at)});
  }
  return out;
}

}  // namespace kvstream::storage
