// A UCX connection: one endpoint, the state both its directions keep (guarded by
// the engine mutex), and the Connection the backend hands out. The send side is
// ucx_send.cpp, the receive side ucx_receive.cpp, one-sided reads ucx_rkey.cpp,
// setup ucx_handshake.cpp, teardown ucx_connection.cpp.
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "kvstream/transport.hpp"
#include "transport/common/peer_fault.hpp"
#include "transport/ucx/ucx_engine.hpp"
#include "transport/ucx/ucx_request.hpp"
#include "transport/ucx/ucx_wire.hpp"

namespace kvstream::transport::ucx_detail {

constexpr size_t kHeaderRing = 32;  // header receives posted ahead per connection
/// How long a broken connection waits for UCX to end its requests after a cancel or
/// a forced close, before leaving them with the connection state.
constexpr std::chrono::milliseconds kAfterCancel{200};
/// How long an orderly close waits to flush the sends posted but never waited for.
constexpr std::chrono::milliseconds kGracefulClose{2000};

/// Per-connection state, guarded by the engine mutex. Requests point into it (its
/// Ops and buffers), so it lives until they are done: a connection that closes with
/// some still pending leaves it in Engine::graveyard.
struct ConnState {
  ucp_ep_h ep = nullptr;
  std::string peer;
  std::string who;  // "ucx <peer>": names this connection's waits in errors
  std::string tls = "?";
  Side side = Side::connected;  // accepted: the peer's faults are logged at debug (peer_fault.hpp)
  uint32_t rx_id = 0;
  uint32_t peer_rx_id = 0;
  bool hello = false;
  bool peer_inline_ok = false;  // the peer accepts small bodies inside the header message
  /// Both hellos announced keys: headers carry the receiver's key and bodies travel
  /// under key-mixed tags (ucx_wire.hpp), both ways.
  bool keyed = false;
  uint64_t rx_key = 0;    // this side's, announced in its hello
  uint64_t peer_key = 0;  // the peer's, from its hello
  bool failed = false;
  bool closed = false;
  bool ended_here = false;  // abandon_posts ended it: no header is delivered after (a peer's failure leaves them)
  std::string fail_msg;
  uint32_t hello_out[kHelloWords] = {kHelloMagic, 0, 0, 0, 0};
  Op hello_op;

  // Receive side.
  struct Slot {
    std::array<std::byte, kHeaderMessageBytes> buf;
    Op op;
    uint32_t seq = 0;
    Clock::time_point seen_at{};  // when staging first saw the header in (the grace starts there)
  };
  std::unique_ptr<std::array<Slot, kHeaderRing>> ring = std::make_unique<std::array<Slot, kHeaderRing>>();
  uint32_t rx_next = 0;
  // Header receives are reposted lazily: a consumed message's slot is reposted at the
  // next recv_header (the caller is about to wait anyway), not on the path from a
  // message's arrival to the caller's reply. Slots for [consumed, reposted) are posted.
  uint32_t consumed = 0;  // messages whose header and body are done
  uint32_t reposted = 0;  // next sequence number to post a header receive for
  bool body_pending = false;
  bool body_claimed = false;  // recv_body posted its own receive for the pending body
  uint32_t body_seq = 0;
  size_t body_size = 0;
  bool body_inline = false;               // the pending body sits in its header slot
  size_t body_inline_off = 0;             // at this offset
  std::byte* body_posted_dest = nullptr;  // the pending inline body was already copied here

  /// A body the background thread received before anyone asked (ucx_staging.cpp).
  struct Staged {
    std::unique_ptr<std::byte[]> buf;
    size_t size = 0;
    Op op;
  };
  std::map<uint32_t, std::unique_ptr<Staged>> staged;

  /// A body receive posted ahead by post_recv, straight into the caller's memory.
  struct Posted {
    std::byte* dest = nullptr;
    size_t capacity = 0;
    Op op;
  };
  std::map<uint32_t, std::unique_ptr<Posted>> posted;
  uint32_t post_next = 0;  // message the next post_recv covers (never behind rx_next)

  /// The body receive recv_body posts itself when the body was neither posted for nor
  /// staged, and its buffer when the body is discarded.
  Op direct_op;
  std::unique_ptr<std::byte[]> direct_scratch;

  // One-sided reads.
  /// Peers' remote keys unpacked on this endpoint, by packed bytes (unpacking is not
  /// free: a reader of many chunks of one region unpacks once).
  std::map<std::string, ucp_rkey_h> rkeys;
  /// Gets UCX did not complete even with the endpoint closed (a broken invariant):
  /// kept, never freed while the worker lives, because UCX may still write them.
  std::vector<std::unique_ptr<Op>> stray_reads;

  // Send side.
  /// One posted message: header copy and the two send requests (stable addresses:
  /// callbacks write into them).
  struct Send {
    uint64_t seq = 0;
    size_t hlen = 0;
    std::array<std::byte, kHeaderMessageBytes> hbuf;
    Op hop, bop;
  };
  std::deque<std::unique_ptr<Send>> sends;       // posted, not yet reaped, in seq order
  uint64_t tx_next = 1;                          // sequence number of the next post_send
  uint64_t tx_reaped = 0;                        // every send <= this completed (and was freed)
  uint64_t tx_error_seq = 0;                     // first send that failed (0: none)
  std::vector<std::unique_ptr<Send>> send_pool;  // reaped Sends for reuse

  /// Where the prefix starts in a header message (after the key on a keyed connection).
  [[nodiscard]] size_t prefix_at() const { return keyed ? kKeyBytes : 0; }
  /// The tag of the body of message `seq` to this side, and to the peer.
  [[nodiscard]] uint64_t rx_body_tag(uint32_t seq) const { return make_body_tag(rx_id, seq, keyed ? rx_key : 0); }
  [[nodiscard]] uint64_t tx_body_tag(uint32_t seq) const {
    return make_body_tag(peer_rx_id, seq, keyed ? peer_key : 0);
  }
  /// Whether a completed header receive holds a message of this connection's peer: on
  /// a keyed connection, one that starts with this side's key. A truncated one never
  /// does (the peer sends at most kHeaderMessageBytes); a failed one is the
  /// connection's own failure.
  [[nodiscard]] bool from_peer(const Slot& slot) const;

  /// Marks the connection failed with `msg` unless it already was (the first cause
  /// is the one reported, and logged here at `level`: warn for our own findings, debug
  /// for UCX's peer errors, which are mostly a peer that left, and for a setup an
  /// accepted peer never finished). Returns whether this call failed it.
  bool fail(std::string msg, spdlog::level::level_enum level = spdlog::level::warn) {
    if (failed) return false;
    failed = true;
    fail_msg = std::move(msg);
    detail::logger().log(level, "ucx: {}", fail_msg);
    return true;
  }
  /// What every call on a failed connection returns (the cause was logged by fail()).
  [[nodiscard]] Status failure() const {
    return detail::repeated_status(StatusCode::unavailable, "ucx: {}",
                                   fail_msg.empty() ? "connection to " + peer + " failed" : fail_msg);
  }
  /// No request of this connection is pending (close waits for this).
  [[nodiscard]] bool requests_done() const;
};

class UcxConnection final : public Connection {
 public:
  UcxConnection(std::shared_ptr<Engine> eng, std::shared_ptr<ConnState> cs)
      : eng_(std::move(eng)), cs_(std::move(cs)) {}
  ~UcxConnection() override;

  Result<uint64_t> post_send(std::span<const std::byte> header, std::span<const std::byte> body) override;
  Status wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) override;
  Result<size_t> recv_header(std::vector<std::byte>& header, Deadline deadline, const CancelToken& cancel) override;
  Status post_recv(std::span<std::byte> dest) override;
  Status abandon_posts() override;
  Status recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) override;
  Status read(std::span<std::byte> dest, const RemoteRegion& src, uint64_t offset, Deadline deadline,
              const CancelToken& cancel) override;

  [[nodiscard]] std::string peer_address() const override { return cs_->peer; }
  [[nodiscard]] std::string describe() const override;

 private:
  // ucx_send.cpp
  void reap_locked();
  [[nodiscard]] bool sends_done_locked() const;
  void cancel_sends(const Status& why);

  // ucx_receive.cpp
  Result<size_t> take_header_locked(std::vector<std::byte>& header);
  void drop_unkeyed_locked(ConnState::Slot& slot);
  Status take_inline_body_locked(std::span<std::byte> dest);
  Status recv_posted_body(std::unique_lock<std::mutex>& lk, std::span<std::byte> dest, Deadline deadline,
                          const CancelToken& cancel);
  Status recv_staged_body(std::unique_lock<std::mutex>& lk, std::span<std::byte> dest, Deadline deadline,
                          const CancelToken& cancel);
  Status recv_unexpected_body(std::unique_lock<std::mutex>& lk, std::span<std::byte> dest, Deadline deadline,
                              const CancelToken& cancel);
  Status wait_for_body(std::unique_lock<std::mutex>& lk, const Op& op, Deadline deadline, const CancelToken& cancel);
  Status body_wait(const Op& op, Deadline deadline, const CancelToken& cancel);
  Status take_landed_body(Op& op, const std::byte* landed, std::span<std::byte> dest);
  bool withdraw_receives(const std::vector<Op*>& ops);
  void finish_body_locked();

  // ucx_connection.cpp
  void force_close_locked();

  std::shared_ptr<Engine> eng_;
  std::shared_ptr<ConnState> cs_;
};

/// Creates the endpoint (from a sockaddr or a connection request), posts the header
/// receives, sends the hello and waits for the peer's (ucx_handshake.cpp). Any failure,
/// the deadline and a cancel included, closes the half-made connection. This side
/// opens the connection (Side::connected).
Result<std::unique_ptr<Connection>> establish(const std::shared_ptr<Engine>& eng, ucp_ep_params_t params,
                                              std::string peer, Deadline deadline, const CancelToken* cancel);

/// establish in two steps, for a listener whose accept() may end (deadline, cancel)
/// while a connection it took is still being set up: begin_establish creates the
/// endpoint and sends the hello; finish_establish waits for the peer's hello. A
/// timed_out or cancelled finish leaves the state open, to be finished by a later
/// call; any other failure closes it. `side`: accepted for a listener's connection.
Result<std::shared_ptr<ConnState>> begin_establish(Engine& eng, ucp_ep_params_t params, std::string peer,
                                                   Side side);
Result<std::unique_ptr<Connection>> finish_establish(const std::shared_ptr<Engine>& eng,
                                                     const std::shared_ptr<ConnState>& cs, Deadline deadline,
                                                     const CancelToken* cancel);
/// How a setup begin_establish started stands: nullopt while the peer's hello or the
/// send of ours is outstanding, OK once both are done (finish_establish then returns
/// at once), else why it failed. Requires mu.
std::optional<Status> setup_outcome(const ConnState& cs);
/// Closes a half-made connection (a listener dropping a setup that never finished).
void abandon_establish(Engine& eng, const std::shared_ptr<ConnState>& cs, std::string_view why);

/// Closes the endpoint, cancels receives and waits (bounded) for every request; a
/// state whose requests did not finish goes to the graveyard (ucx_connection.cpp).
void close_conn(Engine& eng, const std::shared_ptr<ConnState>& cs);

/// Closes `ep` at once, without waiting for its peer or its requests (UCX frees the
/// close request when it completes). Requires mu.
void force_close_endpoint(ucp_ep_h ep);

/// The endpoint's error handler: the peer failed (ucx_connection.cpp).
void ep_error_cb(void* arg, ucp_ep_h ep, ucs_status_t status);

/// Reposts the header receives of consumed messages. Requires mu (ucx_receive.cpp).
void repost_headers(Engine& e, ConnState& cs);

/// Destroys the remote keys unpacked on the endpoint; before the endpoint goes.
/// Requires mu (ucx_rkey.cpp).
void destroy_rkeys_locked(ConnState& cs);

}  // namespace kvstream::transport::ucx_detail
