// One blocking hiredis connection and the reply helpers both Redis clients share
// (the single-server client, redis_client.cpp, and the cluster client,
// redis_cluster_client.cpp). Internal: nothing here is in the public API.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include "kvstream/status.hpp"
#include "kvstream/transport.hpp"

namespace kvstream::redis::detail {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
/// One command as its argv (views into strings the caller keeps alive).
using Command = std::vector<std::string_view>;

/// The bytes of a string, status or error reply ("" for others).
std::string_view reply_str(const redisReply* r);
/// unavailable ("redis refused <what>: ...") when `r` is an error reply, else ok.
Status reply_error(const redisReply* r, std::string_view what);

/// How to reach and log in to one server.
struct ConnSettings {
  std::string address;  ///< host:port or unix:/path
  std::string password;
  uint32_t database = 0;
  std::chrono::milliseconds connect_timeout{2000};
  bool read_only = false;  ///< send READONLY after connecting (reads from a cluster replica)
  /// Log errors where they happen. The cluster client turns it off: it retries other
  /// nodes through a failover and logs the call's outcome once instead.
  bool log_errors = true;
};

/// One hiredis connection, owned by one thread. Reopened lazily by the next call
/// after any transport error (its framing can no longer be trusted then).
class Conn {
 public:
  explicit Conn(ConnSettings s) : s_(std::move(s)) {}
  ~Conn() { close(); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  /// Runs the commands pipelined, returning their replies in order (error replies
  /// included: the caller reads them). Errors: timed_out, unavailable (the
  /// connection broke; it is closed), those of ensure().
  Result<std::vector<Reply>> run(const std::vector<Command>& cmds, transport::Deadline deadline);
  /// Connects, authenticates, selects the database (and READONLY) when not connected.
  /// Errors: invalid_argument (address), timed_out, unavailable, permission_denied.
  Status ensure(transport::Deadline deadline);
  void close();
  [[nodiscard]] const std::string& address() const { return s_.address; }

 private:
  ConnSettings s_;
  redisContext* ctx_ = nullptr;

  Status broken(transport::Deadline deadline, std::string_view what);
  template <typename... Args>
  Status error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) const {
    return s_.log_errors ? make_status(code, "{}", fmt::format(f, std::forward<Args>(args)...))
                         : Status(code, fmt::format(f, std::forward<Args>(args)...));
  }
};

}  // namespace kvstream::redis::detail
