// A libfabric connection: a peer address on an RDM endpoint (the client's own, or
// the listener's, shared) and the connection id its tags carry. The lifecycle is in
// ofi_connection.cpp, the sending side in ofi_send.cpp, the receiving side in
// ofi_receive.cpp and one-sided reads in ofi_rma.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kvstream/transport.hpp"
#include "transport/common/peer_fault.hpp"
#include "transport/ofi/ofi_endpoint.hpp"
#include "transport/ofi/ofi_liveness.hpp"

namespace kvstream::transport::ofi {

class OfiConnection;

/// State the completion callbacks touch (outlives the Connection if need be).
struct ConnShared {
  /// Recursive: a clear's callback may poll (a full provider queue), and the poll
  /// route the next clear of the same connection on the same thread.
  std::recursive_mutex conn_mu;
  OfiConnection* conn = nullptr;  // while it lives (conn_mu): the clears' callbacks reach it
  std::atomic<bool> bye{false};
  std::atomic<uint64_t> peer_sent{0};  // messages the peer says it sent (valid once bye)
  std::atomic<int> send_error{0};      // first async send error (FI_E*)
};

class OfiConnection final : public Connection {
 public:
  /// `side`: an accepted connection shares its listener's endpoint and logs the peer's
  /// faults at debug (transport/common/peer_fault.hpp); one this side opened receives
  /// only what its peer sends (its endpoint may be shared with connections to other
  /// listeners, whose connection ids can be the same as its own).
  /// `peer`: its use of the peer's entry in `ep`'s address vector, held as long as the
  /// connection lives (its operations hold their own).
  /// `hold`: the endpoint's hold on `id` for this connection where the handshake
  /// took it already (say_hello); made here otherwise.
  OfiConnection(std::shared_ptr<Endpoint> ep, PeerTable::Use peer, uint32_t id, std::string peer_name, Side side,
                Endpoint::Expectation hold = {});
  ~OfiConnection() override;

  /// Posts the receive for the peer's "bye".
  Status start();
  /// Accepted side: `responder` answers the peer's liveness probes for this
  /// connection until it closes.
  void answer_probes(std::shared_ptr<ProbeResponder> responder, uint64_t nonce);
  /// Accepted side: the handshake ended without the hello-ack completing, so the peer
  /// never learned of this connection: closing it waits for nothing and sends no bye
  /// (to a peer that may not be reachable at all, where each bye waits 500 ms).
  void never_acknowledged() { peer_lost_.store(true); }
  /// Connecting side: calls that wait on the peer probe it, their probes carrying the
  /// hello's `nonce`; when a probe goes unanswered, `listener` (if any) looks whether
  /// anything still listens at its address, and a peer that `answers_questions` is
  /// asked whether it still knows the connection (ofi_liveness.hpp).
  void probe_peer(uint64_t nonce, std::chrono::milliseconds timeout, std::optional<ListenerCheck> listener,
                  bool answers_questions) {
    probe_ = std::make_unique<PeerProbe>(ep_, peer_.addr(), id_, nonce, timeout, std::move(listener), answers_questions);
  }

  Result<uint64_t> post_send(std::span<const std::byte> header, std::span<const std::byte> body) override;
  Status wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) override;
  /// Posts `dest` for the body of the next message not yet received nor posted for
  /// (Connection::post_recv); over ofi_rxm its clear goes out at once, so a body that
  /// waits for it starts moving as soon as it is sent.
  Status post_recv(std::span<std::byte> dest) override;
  Status abandon_posts() override;
  Result<size_t> recv_header(std::vector<std::byte>& header, Deadline deadline, const CancelToken& cancel) override;
  Status recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) override;
  Status read(std::span<std::byte> dest, const RemoteRegion& src, uint64_t offset, Deadline deadline,
              const CancelToken& cancel) override;
  std::string describe() const override;

 private:
  /// One piece of a posted message (header, or a body segment) not yet handed to the
  /// provider because its queue was full.
  struct Piece {
    std::shared_ptr<Op> op;
    const void* buf;
    size_t len;
    void* desc;
    uint64_t tag;
    bool inject;
  };
  /// A message's body pieces, held until the receiver's clear for it arrives
  /// (Core::cleared_bodies).
  struct Held {
    uint64_t seq;  // on the wire
    std::vector<Piece> pieces;
  };
  /// A posted message and the operations it is made of.
  struct Msg {
    uint64_t seq;  // as returned by post_send
    std::vector<std::shared_ptr<Op>> ops;
  };

  // Sending side (ofi_send.cpp).
  Status send_usable() const;
  std::shared_ptr<Op> new_send_op(size_t buf_size);
  /// Hands queued pieces to the provider, in order, until it says its queue is full;
  /// first the held bodies whose clear arrived join the queue.
  Status flush();
  /// Moves the held bodies whose clear arrived (in order) to the backlog. backlog_mu_ held.
  void release_cleared_locked();
  /// Posts the standing receive of the peer's clears (any sequence of this connection).
  Status post_clear_recv();
  /// A clear arrived (the standing receive completed, in whichever thread reaped it):
  /// noted, the receive posted again, and the body sent where no flush is under way.
  void on_clear(const Op& o);
  Status flush_locked();  // backlog_mu_ held
  /// The receiving side's share of sending: flushes what the provider pushed back,
  /// unless the sender is flushing right now or the sending side is broken.
  void progress_sends();
  /// Drops the messages at the front whose operations all completed.
  void reap();
  /// Breaks the connection's sending side: queued pieces are dropped, posted sends
  /// cancelled and drained, so that the provider no longer reads the caller's bodies.
  void abort_sends();

  // Receiving side (ofi_receive.cpp).
  /// Whom receives take messages from: the peer, on both sides (Endpoint::post_recv
  /// drops it where the provider does not direct receives). Anyone may send under any
  /// connection id of a listener's endpoint (they are small and handed out in order),
  /// so an accepted connection that took its messages from anyone let a peer put a
  /// request into another client's logged-in connection.
  fi_addr_t recv_from() const { return peer_.addr(); }
  Status fail_body(const Status& st);
  /// Posts the receives of message `seq`'s body into `size` bytes at `base`, one per
  /// segment, into `ops` (Endpoint::post_recv's guard keeping queued pieces up to
  /// `keep`); on an error those posted are withdrawn.
  Status post_body_recvs(uint64_t seq, std::byte* base, size_t size, void* desc, std::optional<size_t> keep,
                         Deadline deadline, std::vector<std::shared_ptr<Op>>& ops,
                         const std::shared_ptr<std::byte[]>& scratch = nullptr);
  /// A body's receives that ended in error: the connection breaks (its first error).
  Status body_error(const std::vector<std::shared_ptr<Op>>& ops);
  /// Waits for a body's receives (the connection's sends progressing meanwhile).
  Status wait_body(const std::vector<std::shared_ptr<Op>>& ops, Deadline deadline, const CancelToken& cancel);
  /// Tells the peer to send message `seq`'s body (its receives are posted).
  Status send_clear(uint64_t seq, Deadline deadline, const CancelToken& cancel);
  Result<size_t> corrupt(std::string_view what);
  /// ep_->wait(pred) for a call that waits on the peer: where the peer is probed it
  /// also ends once the peer answered no liveness probe for the timeout, and answers
  /// lost_peer then, unless `pred` holds by that time (what arrived is not dropped).
  template <typename Pred>
  Status wait_on_peer(Pred pred, Deadline deadline, const CancelToken& cancel, std::string_view what) {
    if (!probe_) return ep_->wait(pred, deadline, &cancel, what);
    Status gone;
    Status st = ep_->wait(
        [&] {
          if (pred()) return true;
          gone = probe_->check();
          return !gone.ok();
        },
        deadline, &cancel, what);
    if (st.ok() && !gone.ok() && !pred()) return lost_peer(gone);
    return st;
  }
  /// The connection is unusable: its peer is gone (`why` from PeerProbe::check). Either
  /// side's thread may call it (it touches peer_lost_ alone).
  Status lost_peer(const Status& why);
  /// What every later call answers once the peer was lost: why it was found gone.
  Status peer_lost_status() const;
  Status peer_lost_status_locked() const;  // requires lost_mu_

  std::shared_ptr<Endpoint> ep_;
  Endpoint::Expectation expect_;  // what the stray sweep keeps for this connection (after ep_: let go first)
  PeerTable::Use peer_;  // the peer's entry in ep_'s address vector
  uint32_t id_;
  std::string peer_name_;
  Side side_;
  std::shared_ptr<ConnShared> shared_;
  std::shared_ptr<Op> bye_op_;
  std::shared_ptr<ProbeResponder> responder_;  // accepted side
  std::unique_ptr<PeerProbe> probe_;           // connecting side, where probes are on
  std::atomic<bool> peer_lost_{false};         // a probe went unanswered: nothing to wait for at close
  mutable std::mutex lost_mu_;                 // lost_why_
  std::string lost_why_;                       // why the side that found it lost the peer
  // Sending side: the sender's thread alone, but for backlog_, which the receiving
  // side flushes too (progress_sends), under backlog_mu_.
  uint64_t send_seq_ = 0;          // messages posted
  std::mutex backlog_mu_;
  std::deque<Piece> backlog_;      // pieces waiting for room in the provider's queue
  std::deque<Held> held_;          // bodies waiting for their clear (backlog_mu_)
  std::set<uint64_t> cleared_ready_;  // clears not yet matched to a held body (backlog_mu_)
  uint64_t posted_upto_ = 0;          // send_seq_ as of the last post_send (backlog_mu_)
  std::mutex clears_mu_;
  std::vector<uint64_t> clears_in_;   // clears arrived, not yet seen by a flush (clears_mu_)
  std::shared_ptr<Op> clear_op_;      // the standing receive of the peer's clears (clears_mu_)
  std::atomic<uint64_t> clears_arrived_{0};
  std::deque<Msg> outstanding_;    // posted messages not yet known complete
  // Receiving side.
  /// A receive posted ahead for message `seq` (post_recv): `dest` empty reserves the
  /// message for recv_body; else one receive per segment of `dest`.
  struct Posted {
    uint64_t seq = 0;
    std::span<std::byte> dest;
    std::vector<std::shared_ptr<Op>> ops;
  };
  /// Withdraws a post's receives (cancelled and drained); false (logged) when one
  /// did not end, so its memory may still be written.
  bool withdraw(Posted& p);
  /// recv_body of a message posted ahead: waits for its receives, then copies into
  /// `dest` where that is another span.
  Status recv_posted_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel);
  std::deque<Posted> posted_;          // ahead of recv_seq_, in order
  std::optional<Posted> current_post_;  // the post of the message recv_header returned last
  uint64_t recv_seq_ = 0;
  std::shared_ptr<Op> hdr_op_;
  std::vector<std::shared_ptr<Op>> body_ops_;
  bool body_pending_ = false;
  bool body_waits_ = false;            // the pending body is sent on our clear
  uint64_t body_size_ = 0;
  std::string broken_;
  std::mutex staging_mu_;
  std::shared_ptr<Staging> staging_;  // staged reads' buffer (Core::staged_reads), under staging_mu_
};

}  // namespace kvstream::transport::ofi
