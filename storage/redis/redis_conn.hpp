// One Redis connection and the reply helpers both Redis clients share (the
// single-server client, redis_client.cpp, and the cluster client,
// redis_cluster_client.cpp): commands are written as RESP on a RedisSocket (clear or
// TLS) and replies parsed by hiredis' reader into redisReply objects. Internal:
// nothing here is in the public API.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include "kvstream/status.hpp"
#include "kvstream/transport.hpp"
#include "security/tls_context.hpp"
#include "storage/redis/redis_socket.hpp"

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
  /// TLS to the server (one context per client, shared by its connections); null:
  /// in clear.
  std::shared_ptr<const security::TlsContext> tls;
};

struct ReaderDeleter {
  void operator()(redisReader* r) const { redisReaderFree(r); }
};

/// One connection, owned by one thread. Reopened lazily by the next call after any
/// transport error (its framing can no longer be trusted then).
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
  /// Connects (with the TLS handshake when set), authenticates, selects the database
  /// (and READONLY) when not connected. Errors: invalid_argument (address),
  /// timed_out, unavailable, permission_denied (AUTH refused, a certificate refused
  /// either way), corrupt_data (the server does not speak TLS).
  Status ensure(transport::Deadline deadline);
  void close();
  [[nodiscard]] const std::string& address() const { return s_.address; }

 private:
  ConnSettings s_;
  std::unique_ptr<RedisSocket> sock_;
  std::unique_ptr<redisReader, ReaderDeleter> reader_;
  std::string out_;      // the commands' RESP, but for large arguments (sent from the caller's memory)
  std::vector<char> in_;  // what the socket read, before the reader takes it

  /// Writes `cmds` and reads as many replies. Errors: those of RedisSocket, and
  /// unavailable (a reply that is not RESP); the connection is closed after any.
  Result<std::vector<Reply>> exchange(const std::vector<Command>& cmds, transport::Deadline deadline);
  template <typename... Args>
  Status error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) const {
    return s_.log_errors ? make_status(code, "{}", fmt::format(f, std::forward<Args>(args)...))
                         : Status(code, fmt::format(f, std::forward<Args>(args)...));
  }
};

}  // namespace kvstream::redis::detail
