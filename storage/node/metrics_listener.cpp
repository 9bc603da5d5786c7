#include "storage/node/metrics_listener.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <span>

#include <fmt/format.h>
#include <openssl/err.h>

#include "core/log.hpp"
#include "core/text.hpp"
#include "security/socket_bio.hpp"
#include "storage/protocol.hpp"
#include "transport/common/address.hpp"

namespace kvstream::storage {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kClientTime = std::chrono::seconds(2);
constexpr size_t kMaxRequestBytes = 8192;

int ms_left(Clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return left > 0 ? int(left) : 0;
}

bool wait_for(int fd, short events, Clock::time_point until) {
  pollfd p{fd, events, 0};
  return ::poll(&p, 1, ms_left(until)) > 0;
}

// One client's connection: the socket (non-blocking), in clear or under a TLS
// session whose handshake is done. Every call ends by `until`.
class Stream {
 public:
  Stream(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}

  // Some bytes into `buf`; 0 when the peer closed, failed or was too slow.
  size_t read_some(char* buf, size_t n, Clock::time_point until) {
    for (;;) {
      if (ssl_) {
        const int got = SSL_read(ssl_, buf, int(n));
        if (got > 0) return size_t(got);
        if (!retry(SSL_get_error(ssl_, got), until)) return 0;
        continue;
      }
      const ssize_t got = ::recv(fd_, buf, n, 0);
      if (got > 0) return size_t(got);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd_, POLLIN, until)) continue;
      return 0;
    }
  }

  // All of `text`; false if the peer does not take it in time.
  bool write_all(std::string_view text, Clock::time_point until) {
    while (!text.empty()) {
      if (ssl_) {
        const int n = SSL_write(ssl_, text.data(), int(std::min<size_t>(text.size(), 1 << 20)));
        if (n > 0) {
          text.remove_prefix(size_t(n));
          continue;
        }
        if (!retry(SSL_get_error(ssl_, n), until)) return false;
        continue;
      }
      const ssize_t n = ::send(fd_, text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        text.remove_prefix(size_t(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_for(fd_, POLLOUT, until)) continue;
      return false;
    }
    return true;
  }

 private:
  // After an SSL call that did not complete: waits for what it wants, or gives up.
  bool retry(int err, Clock::time_point until) {
    if (err == SSL_ERROR_WANT_READ) return wait_for(fd_, POLLIN, until);
    if (err == SSL_ERROR_WANT_WRITE) return wait_for(fd_, POLLOUT, until);
    ERR_clear_error();  // a reset or a bad record: this client is done
    return false;
  }
  int fd_;
  SSL* ssl_;
};

std::string response(int code, const char* reason, const std::string& body, const char* type,
                     std::string_view extra_header = {}) {
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{}",
                     code, reason, type, body.size(), extra_header, body);
}

// Header names and the auth scheme compare without regard to ASCII case.
bool iequals(std::string_view a, std::string_view b) {
  const auto lower = [](char c) { return std::tolower(static_cast<unsigned char>(c)); };
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [&](char x, char y) { return lower(x) == lower(y); });
}

/// The credentials of the request's Authorization header with scheme "Bearer"
/// (either case), or nullopt.
std::optional<std::string_view> bearer_of(std::string_view headers) {
  for (size_t at = 0; at < headers.size();) {
    size_t end = headers.find("\r\n", at);
    if (end == std::string_view::npos) end = headers.size();
    const std::string_view line = headers.substr(at, end - at);
    at = end + 2;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !iequals(trim(line.substr(0, colon)), "authorization")) continue;
    const std::string_view value = trim(line.substr(colon + 1));
    const size_t sp = value.find(' ');
    if (sp == std::string_view::npos || !iequals(value.substr(0, sp), "bearer")) return std::nullopt;
    return trim(value.substr(sp + 1));
  }
  return std::nullopt;
}

}  // namespace

bool MetricsListener::authorized(std::string_view headers) {
  std::string token;
  {
    std::lock_guard lock(token_mu_);
    token = token_;
  }
  if (token.empty()) return true;
  const auto given = bearer_of(headers);
  // Compared in constant time, as a login's MAC: the time of a refusal tells nothing
  // of how much of a guess was right.
  const auto bytes = [](std::string_view s) {
    return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  return given && mac_equal(bytes(*given), bytes(token));
}

void MetricsListener::set_bearer_token(std::string token) {
  std::lock_guard lock(token_mu_);
  token_ = std::move(token);
}

Result<std::unique_ptr<MetricsListener>> MetricsListener::start(const std::string& address,
                                                                std::function<std::string()> body,
                                                                std::string bearer_token,
                                                                std::shared_ptr<const security::TlsContext> tls) {
  if (tls && tls->role() != security::TlsRole::server)
    return make_status(StatusCode::invalid_argument, "metrics: a TLS context of the client role cannot serve");
  KVS_ASSIGN_OR_RETURN(auto addrs, transport::resolve_address("metrics", address, /*passive=*/true));
  const sockaddr_storage& sa = addrs.front();
  const int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return make_status(StatusCode::io_error, "metrics: socket: {}", std::strerror(errno));
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sa), transport::sockaddr_len(sa)) != 0 || ::listen(fd, 16) != 0) {
    const int err = errno;
    ::close(fd);
    return make_status(StatusCode::io_error, "metrics: cannot listen on {}: {}", address, std::strerror(err));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int stop = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop < 0) {
    ::close(fd);
    return make_status(StatusCode::io_error, "metrics: eventfd: {}", std::strerror(errno));
  }
  return std::unique_ptr<MetricsListener>(new MetricsListener(
      fd, stop, transport::format_address(bound), std::move(body), std::move(bearer_token), std::move(tls)));
}

MetricsListener::MetricsListener(int listen_fd, int stop_fd, std::string address, std::function<std::string()> body,
                                 std::string bearer_token, std::shared_ptr<const security::TlsContext> tls)
    : listen_fd_(listen_fd), stop_fd_(stop_fd), address_(std::move(address)), body_(std::move(body)),
      tls_(std::move(tls)), token_(std::move(bearer_token)) {
  thread_ = std::thread([this] { run(); });
}

MetricsListener::~MetricsListener() {
  const uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

void MetricsListener::run() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      KVS_LOG_ERROR("metrics: poll failed ({}); the endpoint stops", std::strerror(errno));
      return;
    }
    if (p[1].revents) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors or memory: the connection stays queued and poll would
      // return at once, so wait a moment (or for the stop) before trying again.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        pollfd s{stop_fd_, POLLIN, 0};
        if (::poll(&s, 1, 100) > 0) return;
      }
      continue;  // or the peer left before we took it
    }
    answer(fd);
    ::close(fd);
  }
}

void MetricsListener::answer(int fd) {
  const auto until = Clock::now() + kClientTime;
  // Under TLS the handshake comes first, within the same 2 s; a client that does not
  // complete it (plain HTTP, another protocol, a certificate it refuses) gets nothing.
  security::SslPtr ssl;
  if (tls_) {
    auto session = tls_->new_session({});
    if (!session.ok()) return void(++refused_);
    ssl = std::move(session).value();
    if (!security::attach_socket(ssl.get(), fd).ok()) return void(++refused_);
    // Step by step on the non-blocking socket. A failure is the client's to see and
    // is counted, not logged: any peer that reaches the port could write lines at will.
    for (;;) {
      const security::HandshakeStep step = security::step_handshake(ssl.get(), "a metrics client");
      if (step.done) break;
      if (!step.error.ok() || !wait_for(fd, step.wait_events, until)) {
        KVS_LOG_DEBUG("metrics: {}", step.error.ok() ? "a client's handshake took too long" : step.error.to_string());
        return void(++refused_);
      }
    }
  }
  answer_on(fd, ssl.get(), until);
  if (ssl) (void)SSL_shutdown(ssl.get());  // close_notify, best effort: the socket closes next
}

void MetricsListener::answer_on(int fd, SSL* ssl, std::chrono::steady_clock::time_point until) {
  Stream stream(fd, ssl);
  std::string request;
  char buf[1024];
  // Up to the end of the headers; a request body (a GET has none) is not read.
  while (request.find("\r\n\r\n") == std::string::npos) {
    if (request.size() >= kMaxRequestBytes) return void(++refused_);
    const size_t n = stream.read_some(buf, sizeof buf, until);
    if (n == 0) return void(++refused_);  // closed, failed or too slow
    request.append(buf, n);
  }
  const std::string_view line = std::string_view(request).substr(0, request.find("\r\n"));
  const size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 == std::string_view::npos ? 0 : sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos) {
    (void)stream.write_all(response(400, "Bad Request", "bad request line\n", "text/plain"), until);
    return void(++refused_);
  }
  const std::string_view method = line.substr(0, sp1), path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (method != "GET") {
    (void)stream.write_all(response(405, "Method Not Allowed", "GET /metrics only\n", "text/plain"), until);
    return void(++refused_);
  }
  if (path != "/metrics") {
    (void)stream.write_all(response(404, "Not Found", "GET /metrics only\n", "text/plain"), until);
    return void(++refused_);
  }
  if (!authorized(std::string_view(request).substr(line.size()))) {
    (void)stream.write_all(
                    response(401, "Unauthorized", "a bearer token is needed\n", "text/plain",
                             "WWW-Authenticate: Bearer realm=\"kvstream\"\r\n"),
                    until);
    return void(++refused_);
  }
  std::string text;
  try {
    text = body_();
  } catch (const std::exception& e) {
    KVS_LOG_WARN("metrics: could not make the answer: {}", e.what());
    (void)stream.write_all(response(500, "Internal Server Error", "\n", "text/plain"), until);
    return void(++refused_);
  }
  if (stream.write_all(response(200, "OK", text, "text/plain; version=0.0.4"), until))
    ++served_;
  else
    ++refused_;
}

}  // namespace kvstream::storage
