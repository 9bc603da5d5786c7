// The store's member mark: see member_mark.hpp.
#include "storage/node/member_mark.hpp"

#include <cerrno>
#include <cstring>

#include <unistd.h>

#include "core/log.hpp"
#include "storage/node/mark_record.hpp"
#include "storage/node/object_file.hpp"

namespace kvstream::storage {
namespace {

constexpr uint32_t kMemberMarkMagic = 0x4d53564b;  // "KVSM"; the record's u64 is the time in seconds

}  // namespace

std::optional<std::chrono::system_clock::time_point> read_member_mark(const std::string& dir) {
  const std::string path = dir + "/" + kMemberMarkFile;
  const auto r = read_mark_record(path, kMemberMarkMagic);
  if (!r) {
    if (::access(path.c_str(), F_OK) == 0) KVS_LOG_WARN("store '{}': the member mark does not verify; taken as none", dir);
    return std::nullopt;
  }
  return std::chrono::system_clock::time_point(std::chrono::seconds(int64_t(r->large)));
}

Status write_member_mark(const std::string& dir, std::chrono::system_clock::time_point at) {
  const std::string path = dir + "/" + kMemberMarkFile;
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(at.time_since_epoch()).count();
  const auto b = encode_mark_record(kMemberMarkMagic, {0, uint64_t(seconds)});
  if (const int e = replace_file(path, std::string_view(reinterpret_cast<const char*>(b.data()), b.size()))) {
    KVS_LOG_WARN("cannot write the member mark '{}': {}", path, std::strerror(e));
    return make_status(StatusCode::io_error, "cannot write the member mark '{}': {}", path, std::strerror(e));
  }
  return {};
}

}  // namespace kvstream::storage
