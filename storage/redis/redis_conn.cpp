#include "storage/redis/redis_conn.hpp"

#include <hiredis/read.h>

#include <charconv>

#include "core/log.hpp"

namespace kvstream::redis::detail {

using transport::Clock;
using transport::Deadline;

namespace {

// Arguments at least this long are sent from the caller's memory rather than copied
// into the command buffer: a chunk's value crosses no extra copy on its way out.
constexpr size_t kSendInPlaceBytes = 4096;
// What one read asks of the socket (a large value arrives in as many).
constexpr size_t kReadBytes = 256 << 10;

void append_header(std::string& out, char kind, size_t n) {
  char buf[24];
  buf[0] = kind;
  const auto [end, ec] = std::to_chars(buf + 1, buf + sizeof buf - 2, n);
  (void)ec;  // 20 digits always fit
  out.append(buf, end);
  out.append("\r\n", 2);
}

}  // namespace

std::string_view reply_str(const redisReply* r) {
  return r && r->str ? std::string_view(r->str, r->len) : std::string_view();
}

Status reply_error(const redisReply* r, std::string_view what) {
  if (r->type != REDIS_REPLY_ERROR) return {};
  // "OOM command not allowed when used memory > 'maxmemory'": a server at its memory
  // bound that evicts nothing (maxmemory-policy noeviction). Only removing keys helps.
  const std::string_view e = reply_str(r);
  const bool full = e.substr(0, 4) == "OOM ";
  return make_status(full ? StatusCode::no_space : StatusCode::unavailable, "redis refused {}: {}", what, e);
}

Result<std::vector<Reply>> Conn::run(const std::vector<Command>& cmds, Deadline deadline) {
  if (Clock::now() >= deadline) return error(StatusCode::timed_out, "redis call past its deadline");
  KVS_RETURN_IF_ERROR(ensure(deadline));
  auto rs = exchange(cmds, deadline);
  if (!rs.ok()) return error(rs.status().code(), "redis {}: {}", s_.address, rs.status().message());
  return rs;
}

// RESP as hiredis' redisFormatCommandArgv writes it ("*<argc>", then "$<len>" and
// the bytes per argument, each line ending in CRLF), but pieced: hiredis copies
// every argument twice (formatting, then its output buffer), where a large one here
// goes to the socket (or to TLS) from where the caller holds it.
Result<std::vector<Reply>> Conn::exchange(const std::vector<Command>& cmds, Deadline deadline) {
  out_.clear();
  struct Piece {
    bool own;             // in out_ (an offset), or an argument of the caller
    size_t begin, size;   // own: out_[begin, +size)
    const char* data;     // else
  };
  std::vector<Piece> pieces;
  size_t run_begin = 0;
  for (const auto& argv : cmds) {
    append_header(out_, '*', argv.size());
    for (auto a : argv) {
      append_header(out_, '$', a.size());
      if (a.size() >= kSendInPlaceBytes) {
        pieces.push_back({true, run_begin, out_.size() - run_begin, nullptr});
        pieces.push_back({false, 0, a.size(), a.data()});
        run_begin = out_.size();
      } else {
        out_.append(a.data(), a.size());
      }
      out_.append("\r\n", 2);
    }
  }
  pieces.push_back({true, run_begin, out_.size() - run_begin, nullptr});
  std::vector<std::span<const char>> spans;
  spans.reserve(pieces.size());
  for (const auto& p : pieces) spans.emplace_back(p.own ? out_.data() + p.begin : p.data, p.size);

  Status s = sock_->write_all(spans, deadline);
  std::vector<Reply> out;
  out.reserve(cmds.size());
  while (s.ok() && out.size() < cmds.size()) {
    void* r = nullptr;
    if (redisReaderGetReply(reader_.get(), &r) != REDIS_OK) {
      s = Status(StatusCode::unavailable, fmt::format("reply: not RESP: {}", reader_->errstr));
      break;
    }
    if (r != nullptr) {
      out.emplace_back(static_cast<redisReply*>(r));
      continue;
    }
    if (in_.size() < kReadBytes) in_.resize(kReadBytes);
    auto n = sock_->read_some(in_, deadline);
    if (!n.ok()) {
      s = n.status();
    } else if (redisReaderFeed(reader_.get(), in_.data(), *n) != REDIS_OK) {
      s = Status(StatusCode::unavailable, fmt::format("reply: not RESP: {}", reader_->errstr));
    }
  }
  if (!s.ok()) {
    close();  // its framing can no longer be trusted
    return s;
  }
  return out;
}

Status Conn::ensure(Deadline deadline) {
  if (sock_) return {};
  const Deadline until = std::min(deadline, Clock::now() + s_.connect_timeout);
  auto sock = RedisSocket::open(s_.address, s_.tls.get(), until);
  if (!sock.ok()) {
    const Status& e = sock.status();
    const bool not_tls = s_.tls && e.code() == StatusCode::corrupt_data;
    return error(e.code(), "redis {}: connect: {}{}", s_.address, e.message(),
                 not_tls ? " (does this port serve TLS?)" : "");
  }
  sock_ = std::move(sock).value();
  reader_.reset(redisReaderCreate());
  if (!reader_) {
    close();
    return error(StatusCode::resource_exhausted, "redis: cannot allocate a reply reader");
  }
  std::vector<Command> hello;
  if (!s_.password.empty()) hello.push_back({"AUTH", s_.password});
  const std::string db = std::to_string(s_.database);
  if (s_.database != 0) hello.push_back({"SELECT", db});
  if (s_.read_only) hello.push_back({"READONLY"});
  hello.push_back({"PING"});
  auto rs = exchange(hello, until);
  if (!rs.ok()) {
    // A server that serves TLS only closes a clear connection at its first bytes.
    const bool maybe_tls = !s_.tls && rs.status().code() == StatusCode::unavailable;
    // After the handshake, a TLS refusal is the server's verdict on our certificate.
    const bool refused = s_.tls && rs.status().code() == StatusCode::permission_denied;
    const bool no_cert = refused && s_.tls->settings().cert_file.empty();
    return error(rs.status().code(), "redis {}: connect: {}{}", s_.address, rs.status().message(),
                 maybe_tls ? " (if it serves TLS only, set RedisConfig::tls)"
                 : no_cert ? " (the server asks for a client certificate: RedisConfig::tls.cert_file, key_file)"
                 : refused ? " (the server refused the client certificate RedisConfig::tls.cert_file)"
                           : "");
  }
  for (size_t i = 0; i < hello.size(); ++i) {
    const redisReply* r = (*rs)[i].get();
    if (r->type != REDIS_REPLY_ERROR) continue;
    const std::string msg(r->str, r->len);
    close();
    const auto& argv = hello[i];
    const bool auth =
        argv[0] == "AUTH" || msg.find("NOAUTH") != std::string::npos || msg.find("WRONGPASS") != std::string::npos;
    return error(auth ? StatusCode::permission_denied : StatusCode::unavailable, "redis {}: {}: {}", s_.address,
                 argv[0], auth ? "authentication refused" : msg);
  }
  return {};
}

void Conn::close() {
  reader_.reset();
  sock_.reset();
}

}  // namespace kvstream::redis::detail
