// The libfabric listener: see ofi_listener.hpp. A deadline or cancel that ends
// accept() after it took a hello but before the ack completed leaves that handshake
// pending: the next accept() finishes it first, so no connection the client already
// counts as made is dropped.
#include "transport/ofi/ofi_listener.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "transport/common/address.hpp"
#include "transport/ofi/ofi_handshake.hpp"
#include "transport/ofi/ofi_shm_local.hpp"

namespace kvstream::transport::ofi {
namespace {

using namespace std::chrono_literals;

class OfiListener final : public Listener {
 public:
  OfiListener(std::shared_ptr<Endpoint> ep, std::string address, int reserved_fd)
      : ep_(std::move(ep)), address_(std::move(address)), reserved_fd_(reserved_fd),
        hellos_(std::make_shared<HelloQueue>()) {}

  ~OfiListener() override {
    // Handshakes no accept() finished: a connection whose ack completed says bye, the
    // others were never known to their peers.
    for (auto& hs : pending_)
      if (!hs->acked()) hs->conn->never_acknowledged();
    pending_.clear();
    {
      std::lock_guard lock(hellos_->mu);
      hellos_->closing = true;
    }
    for (auto& op : hello_ops_) ep_->cancel_and_drain(*op, 1s);
    if (reserved_fd_ >= 0) ::close(reserved_fd_);
  }

  Status start() {
    ep_->set_listening();  // before the first hello receive: hellos and probes are ours
    KVS_ASSIGN_OR_RETURN(responder_, ProbeResponder::start(ep_));
    for (size_t i = 0; i < kHelloPool; ++i) KVS_RETURN_IF_ERROR(post_hello());
    return {};
  }

  /// Hellos are taken as they come and their handshakes stepped side by side (at most
  /// kMaxPending at once), so a client that cannot be reached holds up none of the
  /// others. Before, one handshake at a time: a client gone before its ack (its connect
  /// timed out on a loaded host) held the accept loop for kHandshakeLimit while the
  /// provider refused the ack, and clients that gave up meanwhile and said hello again
  /// kept it held: the node stopped accepting (the crash checker over libfabric, four
  /// at once on two cores, hung 10 runs of 11).
  /// The caller's deadline bounds the wait for a connection, not the life of one that
  /// came: a hello taken from the queue is the client's only connection request, so a
  /// handshake a deadline or cancel interrupts stays pending, and the next call steps
  /// it before waiting for another (one whose ack has not completed within
  /// kHandshakeLimit is dropped, unavailable). Dropping it at the caller's deadline
  /// lost connections the client already counted as made: the storage node accepts in
  /// 200 ms rounds, and under TSan the first send on a new tcp;ofi_rxm listener
  /// endpoint (the first hello-ack) takes about 100 ms.
  Result<std::unique_ptr<Connection>> accept(Deadline deadline, const CancelToken& cancel) override {
    for (;;) {
      // The first handshake that completed is this call's connection; one that failed
      // is dropped, and its error returned when none completed (the caller logs it).
      Status dropped;
      for (auto it = pending_.begin(); it != pending_.end();) {
        const Result<bool> step = step_handshake(*ep_, **it);
        if (step.ok() && !*step) {
          ++it;
          continue;
        }
        std::unique_ptr<Handshake> hs = std::move(*it);
        it = pending_.erase(it);
        if (!step.ok()) {
          hs->conn->never_acknowledged();
          if (dropped.ok()) dropped = step.status();
          continue;
        }
        KVS_LOG_DEBUG("libfabric: accepted {} as connection {}", hs->conn->describe(), hs->id);
        return std::unique_ptr<Connection>(std::move(hs->conn));
      }
      KVS_RETURN_IF_ERROR(dropped);
      std::optional<Hello> h;
      bool spent = false;
      std::deque<HelloQueue::Verify> verifies;
      KVS_RETURN_IF_ERROR(ep_->wait(
          [&] {
            {
              std::lock_guard lock(hellos_->mu);
              spent = std::exchange(hellos_->spent, 0) > 0;
              verifies.swap(hellos_->verifies);
              if (pending_.size() < kMaxPending && !hellos_->hellos.empty()) {
                h = hellos_->hellos.front();
                hellos_->hellos.pop_front();
              }
            }
            if (h || spent || !verifies.empty()) return true;
            const auto now = Clock::now();
            return std::any_of(pending_.begin(), pending_.end(),
                               [&](const std::unique_ptr<Handshake>& hs) { return handshake_due(*hs, now); });
          },
          deadline, &cancel, "accept"));
      refill_hellos();
      for (const auto& v : verifies) answer_verify(*ep_, *responder_, v);
      if (h) {
        KVS_ASSIGN_OR_RETURN(auto hs, begin_handshake(ep_, *h, responder_->draw_id(), responder_));
        pending_.push_back(std::move(hs));
      }
    }
  }

  std::string address() const override { return address_; }

  std::optional<uint64_t> peer_entries() const override { return ep_->peer_count(); }

  std::optional<Strays> strays() const override { return ep_->strays(); }

 private:
  static constexpr size_t kHelloPool = 8;    // hello receives kept posted
  static constexpr size_t kMaxPending = 64;  // handshakes stepped at once; later hellos wait

  /// Keeps kHelloPool hello receives posted: one completes per hello, and one that
  /// took a question, junk or an error is replaced as soon as accept() sees it.
  /// A failed repost is logged, not fatal: the hello already taken is still accepted,
  /// and the next call retries.
  void refill_hellos() {
    std::erase_if(hello_ops_, [](const std::shared_ptr<Op>& o) { return o->done.load(); });
    while (hello_ops_.size() < kHelloPool)
      if (Status s = post_hello(); !s.ok()) {
        KVS_LOG_WARN("libfabric: listener {} could not repost a hello receive: {}", address_, s.to_string());
        break;
      }
  }

  Status post_hello() {
    KVS_ASSIGN_OR_RETURN(auto op, post_hello_recv(*ep_, hellos_));
    hello_ops_.push_back(std::move(op));
    return {};
  }

  std::shared_ptr<Endpoint> ep_;
  std::string address_;
  int reserved_fd_;
  std::shared_ptr<HelloQueue> hellos_;
  std::vector<std::shared_ptr<Op>> hello_ops_;
  std::shared_ptr<ProbeResponder> responder_;  // shared with the accepted connections
  // Taken hellos whose acks have not completed (their handshakes), oldest first.
  std::vector<std::unique_ptr<Handshake>> pending_;
};

/// The port of a socket-address endpoint name, if it is one.
std::optional<uint16_t> port_of(const std::vector<unsigned char>& name) {
  if (name.size() >= sizeof(sockaddr_in)) {
    sockaddr_storage ss{};
    std::memcpy(&ss, name.data(), std::min(name.size(), sizeof ss));
    if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  }
  return std::nullopt;
}

/// Binds a socket to a free port on `host` (loopback when it is no IPv4 literal) and
/// keeps it open, so the port stays ours: the socket's fd, `port` set.
Result<int> reserve_port(const std::string& host, uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_status(StatusCode::io_error, "libfabric: socket(): {}", std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    ::close(fd);
    return make_status(StatusCode::io_error, "libfabric: cannot reserve a port on {}: {}", host,
                       std::strerror(errno));
  }
  port = ntohs(sa.sin_port);
  return fd;
}

/// reserve_port, passing over ports whose shm names this process closed, or whose
/// region is on the host already (another process's listener, or a file a dead one
/// left under /dev/shm: ofi_shm_local.hpp): those are held until a fresh one is
/// found, so the kernel does not hand them out again meanwhile.
Result<int> reserve_fresh_port(const Core& core, const std::string& host, uint16_t& port) {
  std::vector<int> passed;
  struct ClosePassed {
    std::vector<int>& fds;
    ~ClosePassed() {
      for (int fd : fds) ::close(fd);
    }
  } close_passed{passed};
  constexpr int kTries = 64;
  for (int i = 0; i < kTries; ++i) {
    uint16_t p = 0;
    KVS_ASSIGN_OR_RETURN(int fd, reserve_port(host, p));
    InfoPtr info;
    const auto name = [&] { return std::string_view(static_cast<const char*>(info.p->src_addr), info.p->src_addrlen); };
    if (!core.shm() || core.getinfo(host, p, FI_SOURCE, info) != 0 || !info.p->src_addr ||
        (!shm_name_was_closed(name()) && !shm_name_on_host(name()))) {
      port = p;
      return fd;
    }
    passed.push_back(fd);
  }
  return make_status(StatusCode::resource_exhausted,
                     "libfabric: {} ports on {} in a row name shm endpoints this process closed or that "
                     "exist on the host", kTries, host);
}

}  // namespace

Result<std::unique_ptr<Listener>> listen_on(const std::shared_ptr<Core>& core, const std::string& address) {
  std::string host;
  uint16_t port = 0;
  KVS_RETURN_IF_ERROR(parse_host_port(address, host, port));
  int reserved = -1;
  const bool sockaddr = core->sockaddr_names();
  if (port == 0 && !sockaddr) {
    // Providers with name-based addresses (shm: "fi_ns://host:port") do not pick a
    // free port: reserve one from the kernel for as long as the listener lives.
    KVS_ASSIGN_OR_RETURN(reserved, reserve_fresh_port(*core, host, port));
  }
  InfoPtr info;
  if (const int r = core->getinfo(host, port, FI_SOURCE, info); r) {
    if (reserved >= 0) ::close(reserved);
    return make_status(StatusCode::unavailable, "libfabric: cannot listen on {} with {}: {}", address,
                       core->provider, fi_err(r));
  }
  const std::string_view shm_name =
      core->shm() && info.p->src_addr
          ? std::string_view(static_cast<const char*>(info.p->src_addr), info.p->src_addrlen)
          : std::string_view();
  if (reserved < 0 && !shm_name.empty() && shm_name_on_host(shm_name) && !shm_name_was_closed(shm_name))
    return make_status(StatusCode::unavailable,
                       "libfabric: cannot listen on {} over shm: its name is taken on this host (/dev/shm/{}: "
                       "a live endpoint's, or one a process that died left; remove it if no process "
                       "holds it)",
                       address, shm_list_name(shm_name));
  if (!shm_name.empty() && shm_name_was_closed(shm_name))
    KVS_LOG_WARN("libfabric: listening on {} under the name of an shm endpoint this process closed: other "
                 "processes reach it, this one cannot (the provider keeps the closed one's unmapped memory "
                 "under the name)",
                 address);
  auto ep = Endpoint::open(core, info.p, /*shared=*/true);
  if (!ep.ok()) {
    if (reserved >= 0) ::close(reserved);
    return ep.status().with_context(fmt::format("listen on {}", address));
  }
  if (sockaddr) {
    auto name = (*ep)->name();
    if (!name.ok()) return name.status();
    port = port_of(*name).value_or(port);
  }
  auto l = std::make_unique<OfiListener>(std::move(ep).value(), fmt::format("{}:{}", host, port), reserved);
  KVS_RETURN_IF_ERROR(l->start());
  KVS_LOG_DEBUG("libfabric: listening on {} ({})", l->address(), core->provider);
  return std::unique_ptr<Listener>(std::move(l));
}

}  // namespace kvstream::transport::ofi
