// The file a node keeps its remembered removes in (tombstones.hpp), so a restart does
// not forget them: `<dir>/.removes`, one line per record,
//
//   <namespace> <context> <version> <unix ms> <xxh3-64 of what precedes, 16 hex>
//
// or, where removes of a namespace were pushed out past the bound (its *horizon*: one
// of them recorded up to then may be forgotten), the same with context `*` and
// version 0 (kForgotten; a file of older code skips such lines as not verifying),
// appended and synced before the remove is acknowledged, and rewritten whole (a
// temporary file renamed over it) when it holds many more lines than removes
// remembered. Ids are [A-Za-z0-9._-], so a space separates fields. A line that does not
// verify (a torn append at a crash) is skipped when the file is read.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream::storage {

struct TombstoneRecord {
  /// The context of a namespace's horizon record (never a context id).
  static constexpr const char* kForgotten = "*";
  std::string ns, ctx;
  uint64_t version = 0;
  int64_t unix_ms = 0;  ///< when it was recorded (wall clock: ages outlive the process)
  [[nodiscard]] bool horizon() const { return ctx == kForgotten; }
  bool operator==(const TombstoneRecord&) const = default;
};

class TombstoneLog {
 public:
  /// Reads the records `path` holds (none when it does not exist) into `records`, in
  /// the order written, and opens it for appending. Errors: io_error.
  static Result<TombstoneLog> open(const std::string& path, std::vector<TombstoneRecord>& records);
  TombstoneLog(TombstoneLog&& o) noexcept;
  TombstoneLog& operator=(TombstoneLog&& o) noexcept;
  TombstoneLog(const TombstoneLog&) = delete;
  TombstoneLog& operator=(const TombstoneLog&) = delete;
  ~TombstoneLog();

  /// Appends records and syncs them (one write, one sync). Errors: io_error.
  Status append(std::span<const TombstoneRecord> records);
  /// Replaces the file by one holding `records` alone (durably: synced, renamed, its
  /// directory synced). Errors: io_error (the old file and its appends stay).
  Status rewrite(const std::vector<TombstoneRecord>& records);
  /// Lines in the file (valid or not) since it was opened or rewritten.
  [[nodiscard]] size_t lines() const { return lines_; }

  /// One record as its line (with the newline), and back (nullopt: it does not verify).
  static std::string format(const TombstoneRecord& r);
  static bool parse(const std::string& line, TombstoneRecord& out);

 private:
  TombstoneLog(std::string path, int fd, size_t lines) : path_(std::move(path)), fd_(fd), lines_(lines) {}
  std::string path_;
  int fd_ = -1;
  size_t lines_ = 0;
};

}  // namespace kvstream::storage
