// The storage node's background re-encryption (encryption at rest): a pass of
// ChunkStore::reencrypt at start and after each reload of the key file, paced, and
// cancelled at stop or by a newer reload (the pass then starts over under the new
// current key; what it had rewritten stays rewritten).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "storage/node/chunk_store.hpp"

namespace kvstream::storage {

class Reencryptor {
 public:
  /// Starts the thread; passes run on kick(). `store` must outlive this.
  Reencryptor(ChunkStore& store, uint64_t bytes_per_second);
  ~Reencryptor();  ///< cancels the pass under way and joins
  Reencryptor(const Reencryptor&) = delete;
  Reencryptor& operator=(const Reencryptor&) = delete;

  /// A pass soon, under the store's keys as they are then (cancels one under way).
  void kick();
  /// Objects rewritten under the current key since start.
  [[nodiscard]] uint64_t reencrypted() const { return reencrypted_.load(std::memory_order_relaxed); }

 private:
  void loop();
  ChunkStore& store_;
  const uint64_t bytes_per_second_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, stopping_ = false;  // guarded by mu_
  transport::CancelToken running_;           // the pass under way (guarded by mu_)
  std::atomic<uint64_t> reencrypted_{0};
  std::thread thread_;
};

}  // namespace kvstream::storage
