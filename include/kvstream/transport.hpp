// Transport: moves framed messages between a client and a storage node over one of
// several backends (tcp over io_uring, UCX, libfabric), each declaring what it can do.
//
// A message is a small header (the chunk protocol's fields, at most
// kMaxHeaderBytes) and an optional body that is sent from, and received straight
// into, registered memory. Every blocking call takes a deadline and a cancel token;
// a peer that dies or stalls yields an error by the deadline, never a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvstream/status.hpp"
#include "kvstream/transport_config.hpp"

namespace kvstream::transport {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

/// Whether every address "host:port" resolves to is a loopback address (so a clear
/// listener there is reachable from this machine only); false when it does not
/// resolve.
bool is_loopback_address(const std::string& address);

/// A deadline `ms` milliseconds from now.
inline Deadline deadline_in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

/// Largest message header: headers carry protocol fields, never payload.
inline constexpr size_t kMaxHeaderBytes = 4096;

/// Shared cancellation flag: cancel() makes every call waiting on it return
/// StatusCode::cancelled promptly. Cheap to copy.
class CancelToken {
 public:
  CancelToken() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
  void cancel() const noexcept { flag_->store(true, std::memory_order_release); }
  [[nodiscard]] bool cancelled() const noexcept { return flag_->load(std::memory_order_acquire); }

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
};

/// What a backend can do, declared so callers choose paths explicitly instead of
/// discovering a slow fallback.
struct Capabilities {
  std::string backend;          ///< "tcp", "ucx", "libfabric"
  std::string provider;         ///< what carries it: "io_uring", UCX transports, libfabric provider
  bool host_memory = true;      ///< bodies in host memory
  bool cuda_memory = false;     ///< bodies straight to/from GPU memory (GPUDirect)
  bool one_sided_read = false;  ///< RMA reads of registered remote memory
  bool notifications = false;   ///< completion notifications to the remote side
  uint64_t max_message_bytes = 0;
};

/// What a peer needs to read a registered region one-sidedly: where it is and the
/// backend's packed remote key (a UCX rkey). It travels inside message headers, so it
/// is bounded; encode_remote / decode_remote give its wire form.
struct RemoteRegion {
  uint64_t address = 0;
  uint64_t size = 0;
  std::vector<std::byte> key;
};
/// Largest packed remote key accepted from a peer.
inline constexpr size_t kMaxRemoteKeyBytes = 2048;
/// Wire form: u64 address, u64 size, u32 key length, key (little-endian).
std::vector<std::byte> encode_remote(const RemoteRegion& r);
/// Parses a peer's RemoteRegion. Errors: corrupt_data (short, key too long, trailing bytes).
Result<RemoteRegion> decode_remote(std::span<const std::byte> bytes);

/// A registered buffer (RAII: deregistered when the last handle goes away). Backends
/// cache registrations, so registering the same range again is cheap.
class MemoryRegion {
 public:
  /// A backend's registration (defined inside the library).
  struct Impl;
  MemoryRegion() = default;
  [[nodiscard]] std::byte* data() const noexcept;
  [[nodiscard]] size_t size() const noexcept;
  [[nodiscard]] MemoryType type() const noexcept;
  [[nodiscard]] bool valid() const noexcept { return impl_ != nullptr; }
  /// The registered span [offset, offset + n); empty when out of range.
  [[nodiscard]] std::span<std::byte> span(size_t offset, size_t n) const noexcept;
  /// Lets peers read this region one-sidedly (Connection::read) for as long as it
  /// stays registered. Errors: unsupported where the backend has no one-sided reads
  /// (Capabilities::one_sided_read is false), invalid_argument for an empty region.
  [[nodiscard]] Result<RemoteRegion> expose() const;
  /// True when both handles refer to the same registration (the backends' cache
  /// hands out one registration per range).
  [[nodiscard]] bool same_registration(const MemoryRegion& other) const noexcept { return impl_ == other.impl_; }

 private:
  friend struct RegionAccess;  // the backends wrap and unwrap registrations
  explicit MemoryRegion(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

/// One connected peer. One thread may send while another receives; two concurrent
/// senders (or receivers) on one connection must serialise themselves.
class Connection {
 public:
  virtual ~Connection() = default;

  /// Sends one message. `body` must lie in memory registered with this connection's
  /// backend (or be empty). Returns once the message is handed to the transport
  /// (the buffers may be reused): post_send then wait_sends, after checking the
  /// header's size and, before anything is queued, the deadline and the cancel token
  /// (so a send refused there leaves the connection intact). Errors: those of
  /// post_send and wait_sends; invalid_argument for a header over kMaxHeaderBytes.
  Status send(std::span<const std::byte> header, std::span<const std::byte> body, Deadline deadline,
              const CancelToken& cancel);

  /// Starts sending one message and returns without waiting, so that several
  /// messages can be in flight (what bandwidth needs on rendezvous transports). The
  /// header is copied; the body must stay valid and unchanged until wait_sends covers
  /// this message. Returns a sequence number (increasing per connection). A message
  /// is guaranteed to make progress only while its sender is inside a send call
  /// (post_send, wait_sends, send), on libfabric also while the same connection is in
  /// recv_header or recv_body (so posting, then awaiting the peer's answer works);
  /// other transports may keep the rest queued until then, so a thread that posts and
  /// then blocks receiving that message on the peer's connection can stall. Errors:
  /// those of send, immediately (a broken connection, bad arguments).
  virtual Result<uint64_t> post_send(std::span<const std::byte> header, std::span<const std::byte> body) = 0;

  /// Waits until every message posted up to and including `seq` has been handed to
  /// the transport (their bodies may be reused). On timed_out or cancelled the
  /// connection is broken (later calls fail with unavailable): a message may be half
  /// sent.
  virtual Status wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) = 0;

  /// Posts `dest` (registered memory) for the body of the next message that neither
  /// recv_header has returned nor an earlier post_recv covered, so that a rendezvous
  /// transport (UCX) lands the body the moment it arrives instead of when recv_body
  /// is called: what bandwidth needs there, as ucx_perftest's pre-posted receives.
  /// An empty `dest` reserves that message for recv_body alone. recv_body for a
  /// covered message waits for the posted receive (given `dest` again, nothing is
  /// copied; another span gets a copy; an empty one discards). A message without a
  /// body releases its post; a body larger than `dest` is an error. `dest` must stay
  /// valid until that message's recv_body succeeds or the connection is destroyed.
  /// Backends whose bodies arrive in order on a stream (tcp) need no post and ignore
  /// it (recv_body reads the stream as before).
  virtual Status post_recv(std::span<std::byte> dest) {
    (void)dest;
    return {};
  }

  /// Withdraws every receive posted ahead (post_recv) that no recv_body has taken, so
  /// that their memory is the caller's again at once: for a caller whose exchange
  /// failed part way (a malformed or late message) and who will not read on. Ends the
  /// connection when there was any (later calls fail with unavailable): the messages
  /// they were for can no longer be received in step. Waits a bounded time (seconds at
  /// most) for the transport to end them, as a destructor does. Errors: internal when
  /// a receive could not be withdrawn and may still write its memory (the connection
  /// is failed; that memory must then live until the connection is destroyed).
  /// Backends that ignore post_recv have nothing to withdraw.
  virtual Status abandon_posts() { return {}; }

  /// Receives the next message's header into `header` (resized) and returns the size
  /// of its body, which must then be read with recv_body before the next message.
  virtual Result<size_t> recv_header(std::vector<std::byte>& header, Deadline deadline, const CancelToken& cancel) = 0;

  /// Receives the body announced by recv_header into `dest` (registered memory, at
  /// least that large), or discards it when `dest` is empty.
  virtual Status recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) = 0;

  /// Reads `dest.size()` bytes at `offset` of the peer's exposed region `src` into
  /// `dest` (registered memory), one-sidedly: the peer's application takes no part.
  /// Errors: unsupported (the backend has no one-sided reads: Capabilities says so),
  /// out_of_range (past the end of `src`), invalid_argument (a key that does not
  /// unpack), timed_out / cancelled (the connection is then broken, so nothing lands
  /// in `dest` afterwards), unavailable (the peer failed).
  virtual Status read(std::span<std::byte> dest, const RemoteRegion& src, uint64_t offset, Deadline deadline,
                      const CancelToken& cancel) {
    (void)dest, (void)src, (void)offset, (void)deadline, (void)cancel;
    return make_status(StatusCode::unsupported, "{}: one-sided reads are not available on this backend", describe());
  }

  /// The names (subject CN, DNS and URI alternative names) of the certificate the
  /// peer presented and this side verified (mutual TLS); empty without one.
  [[nodiscard]] virtual std::vector<std::string> peer_certificate_names() const { return {}; }

  /// The peer's "host:port" as this backend sees it (a listener's per-source limits
  /// use it); empty where the backend cannot tell.
  [[nodiscard]] virtual std::string peer_address() const { return {}; }

  /// "tcp 127.0.0.1:7471 (io_uring)" and the like: backend, address, path.
  [[nodiscard]] virtual std::string describe() const = 0;
};

/// Accepts connections on an address.
class Listener {
 public:
  virtual ~Listener() = default;
  /// Waits for the next connection until `deadline`; timed_out when none came.
  virtual Result<std::unique_ptr<Connection>> accept(Deadline deadline, const CancelToken& cancel) = 0;
  /// The address peers connect to (with the port actually bound).
  [[nodiscard]] virtual std::string address() const = 0;
  /// Entries the listener keeps for peers apart from their connections: libfabric's
  /// address vector (after removing the entries nothing uses, so: the peers it
  /// serves); nullopt where a peer's state is its connection alone (tcp, UCX).
  [[nodiscard]] virtual std::optional<uint64_t> peer_entries() const { return std::nullopt; }
  /// Messages that arrived under tags no receive would ever take (a closed
  /// connection's, a peer's guesses), which the listener's worker or endpoint
  /// dropped, and their bytes as sent.
  struct Strays {
    uint64_t messages = 0;
    uint64_t bytes = 0;
  };
  /// The strays dropped so far: UCX and libfabric over ofi_rxm, whose tag matching
  /// keeps such a message until a receive takes it; nullopt where nothing strays that
  /// way (tcp: each connection is its own byte stream) or they are not swept
  /// (libfabric's shm, which cannot peek at its queue).
  [[nodiscard]] virtual std::optional<Strays> strays() const { return std::nullopt; }
};

/// A transport backend: creates listeners and connections, registers memory.
/// Thread-safe: several threads may connect, listen and register at once (storage
/// clients to several nodes share one backend: storage::Client::connect).
class Backend {
 public:
  virtual ~Backend() = default;
  [[nodiscard]] virtual const Capabilities& capabilities() const = 0;
  /// Listens on "host:port" (port 0: any free port).
  virtual Result<std::unique_ptr<Listener>> listen(const std::string& address) = 0;
  /// Connects to "host:port" by `deadline`.
  virtual Result<std::unique_ptr<Connection>> connect(const std::string& address, Deadline deadline,
                                                      const CancelToken& cancel) = 0;
  /// Registers [data, data + size) of type `type` for message bodies.
  virtual Result<MemoryRegion> register_memory(void* data, size_t size, MemoryType type) = 0;
};

/// Names of the backends compiled into this build.
std::vector<std::string> available_backends();

/// Creates a backend. Errors: unsupported when the backend is not built in or cannot
/// serve `config.memory` (the message says which path is missing), unavailable when
/// its runtime cannot start. The chosen backend and path are logged.
Result<std::unique_ptr<Backend>> create_backend(const BackendConfig& config);

}  // namespace kvstream::transport
