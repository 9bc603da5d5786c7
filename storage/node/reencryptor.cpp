#include "storage/node/reencryptor.hpp"

#include <filesystem>

#include "core/log.hpp"

namespace kvstream::storage {

Reencryptor::Reencryptor(ChunkStore& store, uint64_t bytes_per_second)
    : store_(store), bytes_per_second_(bytes_per_second), thread_([this] { loop(); }) {}

Reencryptor::~Reencryptor() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    running_.cancel();
  }
  cv_.notify_all();
  thread_.join();
}

void Reencryptor::kick() {
  {
    std::lock_guard lock(mu_);
    pending_ = true;
    running_.cancel();  // a pass under the previous keys would rewrite to a key no longer current
  }
  cv_.notify_all();
}

void Reencryptor::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pending_ || stopping_; });
    if (stopping_) return;
    pending_ = false;
    running_ = transport::CancelToken();
    const ChunkStore::ReencryptOptions options{bytes_per_second_, running_, &reencrypted_};
    lock.unlock();
    auto r = store_.reencrypt(options);
    lock.lock();
    if (!r.ok()) {
      KVS_LOG_WARN("at-rest re-encryption: {}", r.status().to_string());
      continue;
    }
    if (r->reencrypted || r->missing_key || r->failed || r->remaining)
      KVS_LOG_INFO("at-rest re-encryption{}: {} objects ({} MiB) rewritten under the current key, {} left to newer "
                   "writes, {} under keys the key file lacks, {} failed; {} objects not under the current key",
                   r->cancelled ? " (stopped)" : "", r->reencrypted, r->bytes >> 20, r->replaced, r->missing_key,
                   r->failed, r->remaining);
  }
}

Result<ReencryptReport> reencrypt_store(const std::string& directory, const AtRestSettings& at_rest,
                                        uint64_t bytes_per_second) {
  if (at_rest.key_file.empty()) return make_status(StatusCode::invalid_argument, "re-encryption needs a key file");
  std::error_code ec;
  if (!std::filesystem::is_directory(directory, ec))
    return make_status(StatusCode::not_found, "no storage directory '{}'", directory);
  KVS_ASSIGN_OR_RETURN(auto keys, security::KeyRing::load(at_rest.key_file));
  // Only the pass's one piece buffer draws from it: nothing is cached.
  MemoryBudget budget(uint64_t(64) << 20);
  KVS_ASSIGN_OR_RETURN(auto store, ChunkStore::open(directory, 0, budget, std::move(keys)));
  return store->reencrypt({bytes_per_second, {}});
}

}  // namespace kvstream::storage
