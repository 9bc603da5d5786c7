#include "storage/redis/redis_conn.hpp"

#include <sys/time.h>

#include <cerrno>

#include "core/log.hpp"
#include "transport/common/address.hpp"

namespace kvstream::redis::detail {

using namespace std::chrono_literals;
using transport::Clock;
using transport::Deadline;

namespace {

timeval timeval_until(Deadline d) {
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(d - Clock::now());
  if (left < 1ms) left = 1ms;  // 0 would mean "no timeout" to the kernel
  timeval tv{};
  tv.tv_sec = time_t(left.count() / 1000000);
  tv.tv_usec = suseconds_t(left.count() % 1000000);
  return tv;
}

}  // namespace

std::string_view reply_str(const redisReply* r) {
  return r && r->str ? std::string_view(r->str, r->len) : std::string_view();
}

Status reply_error(const redisReply* r, std::string_view what) {
  if (r->type == REDIS_REPLY_ERROR)
    return make_status(StatusCode::unavailable, "redis refused {}: {}", what, std::string_view(r->str, r->len));
  return {};
}

Result<std::vector<Reply>> Conn::run(const std::vector<Command>& cmds, Deadline deadline) {
  if (Clock::now() >= deadline) return error(StatusCode::timed_out, "redis call past its deadline");
  KVS_RETURN_IF_ERROR(ensure(deadline));
  redisSetTimeout(ctx_, timeval_until(deadline));
  for (const auto& argv : cmds) {
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (auto a : argv) ptrs.push_back(a.data()), lens.push_back(a.size());
    if (redisAppendCommandArgv(ctx_, int(ptrs.size()), ptrs.data(), lens.data()) != REDIS_OK)
      return broken(deadline, "append");
  }
  std::vector<Reply> out;
  for (size_t i = 0; i < cmds.size(); ++i) {
    void* r = nullptr;
    if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) return broken(deadline, "reply");
    out.emplace_back(static_cast<redisReply*>(r));
  }
  return out;
}

Status Conn::ensure(Deadline deadline) {
  if (ctx_) return {};
  const Deadline until = std::min(deadline, Clock::now() + s_.connect_timeout);
  const timeval tv = timeval_until(until);
  if (s_.address.rfind("unix:", 0) == 0) {
    ctx_ = redisConnectUnixWithTimeout(s_.address.c_str() + 5, tv);
  } else {
    std::string host;
    uint16_t port = 0;
    KVS_RETURN_IF_ERROR(transport::parse_host_port(s_.address, host, port));
    ctx_ = redisConnectWithTimeout(host.c_str(), port, tv);
  }
  if (ctx_ == nullptr) return error(StatusCode::resource_exhausted, "redis: cannot allocate a context");
  if (ctx_->err) {
    Status s = error(Clock::now() >= until ? StatusCode::timed_out : StatusCode::unavailable,
                           "redis {}: connect: {}", s_.address, ctx_->errstr);
    close();
    return s;
  }
  std::vector<Command> hello;
  if (!s_.password.empty()) hello.push_back({"AUTH", s_.password});
  const std::string db = std::to_string(s_.database);
  if (s_.database != 0) hello.push_back({"SELECT", db});
  if (s_.read_only) hello.push_back({"READONLY"});
  hello.push_back({"PING"});
  redisSetTimeout(ctx_, timeval_until(until));
  for (const auto& argv : hello) {
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (auto a : argv) ptrs.push_back(a.data()), lens.push_back(a.size());
    void* raw = redisCommandArgv(ctx_, int(ptrs.size()), ptrs.data(), lens.data());
    if (raw == nullptr) return broken(until, "connect");
    Reply r(static_cast<redisReply*>(raw));
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string msg(r->str, r->len);
      close();
      const bool auth =
          argv[0] == "AUTH" || msg.find("NOAUTH") != std::string::npos || msg.find("WRONGPASS") != std::string::npos;
      return error(auth ? StatusCode::permission_denied : StatusCode::unavailable, "redis {}: {}: {}",
                         s_.address, argv[0], auth ? "authentication refused" : msg);
    }
  }
  return {};
}

void Conn::close() {
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

Status Conn::broken(Deadline deadline, std::string_view what) {
  const bool late = Clock::now() >= deadline ||
                    (ctx_ && ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK));
  Status s = error(late ? StatusCode::timed_out : StatusCode::unavailable, "redis {}: {}: {}", s_.address, what,
                         ctx_ && ctx_->errstr[0] ? ctx_->errstr : "connection lost");
  close();  // its framing can no longer be trusted
  return s;
}

}  // namespace kvstream::redis::detail
