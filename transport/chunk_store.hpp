// The storage node's store: one file per (namespace, context, chunk, level) under a
// directory, an in-memory index rebuilt from the directory at start, checksummed
// objects, reads through io_uring, and an LRU cache of hot chunks.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

using Bytes = std::shared_ptr<const std::vector<std::byte>>;

class ChunkStore {
 public:
  /// Opens (creating) `directory` and indexes what is there. Errors: io_error.
  static Result<std::unique_ptr<ChunkStore>> open(const std::string& directory, uint64_t cache_bytes);

  /// Writes durably: temporary file, fsync, rename, fsync of the directory; a failed
  /// write (disk full) leaves no partial object visible.
  Status put(const std::string& ns, const std::string& ctx, uint32_t chunk, uint32_t level,
             std::span<const std::byte> bytes);
  /// The object's bytes (checksum verified). Errors: not_found, corrupt_data, io_error.
  Result<Bytes> get(const std::string& ns, const std::string& ctx, uint32_t chunk, uint32_t level, bool* cache_hit);
  Result<std::vector<ChunkStat>> stat(const std::string& ns, const std::string& ctx);
  Status remove(const std::string& ns, const std::string& ctx);
  std::vector<std::string> list(const std::string& ns);

 private:
  struct Context {
    std::map<uint32_t, std::vector<uint64_t>> sizes;  // chunk -> bytes per level (0 = absent)
  };
  std::string dir_;
  uint64_t cache_limit_ = 0;
  std::mutex mu_;
  std::map<std::string, std::map<std::string, Context>> index_;  // ns -> ctx -> chunks
  // LRU cache: most recent at the front.
  std::list<std::pair<std::string, Bytes>> lru_;
  std::unordered_map<std::string, std::list<std::pair<std::string, Bytes>>::iterator> cache_;
  uint64_t cache_used_ = 0;

  std::string path(const std::string& ns, const std::string& ctx) const;
  static std::string file_name(uint32_t chunk, uint32_t level);
  void cache_put(const std::string& key, Bytes b);
  void cache_drop_prefix(const std::string& prefix);
};

/// Reads a file from byte `offset` to its end (io_uring where built in, else pread).
/// Errors: not_found, io_error (also when the file is shorter than `offset`).
Result<std::vector<std::byte>> read_file(const std::string& path, size_t offset = 0);

}  // namespace kvstream::storage
