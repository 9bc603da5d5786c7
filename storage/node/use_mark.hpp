// A context's use mark (Client::touch): the highest stamp a client gave it and the
// depth given with that stamp. The node keeps it in its index and in a small file
// beside the context's objects, `<context dir>/use`, rewritten in place when a touch
// raises it. Not fsynced: a crash may lose the last marks, which only makes those
// contexts look used earlier than they were; a torn file fails its checksum and reads
// as no mark. The scan at start reads it back; a remove deletes it with the context.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kvstream/status.hpp"

namespace kvstream::storage {

struct UseMark {
  uint64_t stamp = 0;  // 0: never touched
  uint32_t depth = 0;
  bool operator==(const UseMark&) const = default;
};

/// The file's name in a context directory. Not an object name (objects are c<n>.l<n>),
/// so the scan never takes it for one.
inline constexpr const char* kUseMarkFile = "use";

/// The mark in `context_dir`; nullopt when there is none or it does not verify.
std::optional<UseMark> read_use_mark(const std::string& context_dir);

/// Writes `mark` to `context_dir` (which exists). Errors: io_error.
Status write_use_mark(const std::string& context_dir, UseMark mark);

}  // namespace kvstream::storage
