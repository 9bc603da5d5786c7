// The storage node's /metrics endpoint (kvstream-server --metrics): an HTTP/1.1
// responder on its own socket and thread, for a Prometheus scraper. It answers
// GET /metrics with what `body` returns (the Prometheus text format), any other path
// 404 and any other method 405, and closes each connection after one answer. A client
// gets 2 s to send its request (8 KiB at most) and to read the answer, one client at a
// time: a scraper's poll is all it serves, and nothing a peer sends can hold it longer.
// With a bearer token (what Prometheus sends from a scrape config's `authorization`
// or `bearer_token_file`), a request without `Authorization: Bearer <token>` is
// answered 401: the tenants' names and usage are not for whoever reaches the port.
// With a TLS context (kvstream-server --metrics-tls: the node's certificate) it
// speaks HTTPS, TLS 1.3 only, the handshake inside the client's 2 s; without one the
// token and the answer cross the network in clear, so bind it to loopback or a
// management network.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "kvstream/status.hpp"
#include "security/tls_context.hpp"

namespace kvstream::storage {

class MetricsListener {
 public:
  /// Listens on `address` ("host:port"; port 0: any); `bearer_token` empty: no login;
  /// `tls` (a server context) null: plain HTTP. Errors: invalid_argument (address, a
  /// client context), io_error (socket, bind, listen).
  static Result<std::unique_ptr<MetricsListener>> start(const std::string& address,
                                                        std::function<std::string()> body,
                                                        std::string bearer_token = {},
                                                        std::shared_ptr<const security::TlsContext> tls = nullptr);
  ~MetricsListener();  // stops and joins
  MetricsListener(const MetricsListener&) = delete;
  MetricsListener& operator=(const MetricsListener&) = delete;

  /// The address it listens on (the actual port).
  [[nodiscard]] const std::string& address() const { return address_; }
  /// Answers given with the metrics, and connections that got another answer or none.
  [[nodiscard]] uint64_t served() const { return served_; }
  [[nodiscard]] uint64_t refused() const { return refused_; }
  /// Replaces the token (a rotation: the next request needs the new one); empty: no login.
  void set_bearer_token(std::string token);

 private:
  MetricsListener(int listen_fd, int stop_fd, std::string address, std::function<std::string()> body,
                  std::string bearer_token, std::shared_ptr<const security::TlsContext> tls);
  void run();
  void answer(int fd);
  void answer_on(int fd, SSL* ssl, std::chrono::steady_clock::time_point until);
  /// Whether the request's headers carry the token (or none is needed).
  bool authorized(std::string_view headers);

  int listen_fd_, stop_fd_;
  std::string address_;
  std::function<std::string()> body_;
  std::shared_ptr<const security::TlsContext> tls_;  // null: plain HTTP
  std::mutex token_mu_;
  std::string token_;  // under token_mu_
  std::atomic<uint64_t> served_{0}, refused_{0};
  std::thread thread_;
};

}  // namespace kvstream::storage
