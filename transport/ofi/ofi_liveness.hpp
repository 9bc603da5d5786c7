// Whether the peer of a libfabric connection is still there. RDM has no connection
// for a dying peer to break: a client waiting on a node that was killed hears nothing
// (ofi_rxm retries the connection to it and answers sends EAGAIN), so it used to learn
// of the death only at its call's deadline, where tcp and UCX fail at once. So a
// connection this side opened probes its peer while one of its calls waits and
// nothing has come from the peer for a while; the listener's endpoint answers probes
// for the connections it accepted, from whichever thread reaps the probe's
// completion (its progress thread when the node's own threads are busy). A probe
// names the connection and carries the nonce of its hello, so a node that restarted
// and numbers its connections from 1 again does not answer for a connection it never
// made.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "transport/ofi/ofi_endpoint.hpp"
#include "transport/ofi/ofi_reachability.hpp"

namespace kvstream::transport::ofi {

/// Listener side: answers probes for the connections accepted on one endpoint.
/// Shared by the listener and those connections; its receives end with the last.
class ProbeResponder : public std::enable_shared_from_this<ProbeResponder> {
 public:
  /// Receives kept posted for probes.
  static constexpr size_t kPool = 4;

  static Result<std::shared_ptr<ProbeResponder>> start(std::shared_ptr<Endpoint> ep);
  ~ProbeResponder();
  ProbeResponder(const ProbeResponder&) = delete;
  ProbeResponder& operator=(const ProbeResponder&) = delete;

  /// An id for a new connection that no live one uses, drawn at random: a node
  /// that restarted gives out other ids than its last life did, so a message a
  /// client sent on a connection of that life (queued unmatched in the endpoint)
  /// is not taken by a new connection of the same client (when ids went out in
  /// order from 1, the new node's first connection took the old first one's
  /// requests, and its answers went to the new one's). One in 2^20 per such
  /// connection still draws the old id.
  uint32_t draw_id() const;
  /// Connection `id`, opened by the hello with `nonce` from `peer`, is answered for.
  void add(uint32_t id, uint64_t nonce, fi_addr_t peer);
  /// It is no longer (closed): probes for it go unanswered.
  void remove(uint32_t id);
  /// Whether connection `id`, opened by the hello with `nonce`, is answered for.
  [[nodiscard]] bool knows(uint32_t id, uint64_t nonce) const;

 private:
  explicit ProbeResponder(std::shared_ptr<Endpoint> ep) : ep_(std::move(ep)) {}
  /// Tops the posted receives up to kPool, one attempt each (mu_ held).
  void refill_locked();
  /// A probe's completion: answers it if it names a live connection and its nonce.
  void answer(const Op& op);

  struct Live {
    uint64_t nonce;
    fi_addr_t peer;
  };
  std::shared_ptr<Endpoint> ep_;
  mutable std::mutex mu_;
  std::unordered_map<uint32_t, Live> live_;
  std::vector<std::shared_ptr<Op>> posted_;
};

/// Connecting side: the liveness of one connection's peer.
class PeerProbe {
 public:
  /// Probes go out after `timeout` / 4 without a word from the peer; the peer is
  /// taken as gone when a probe stays unanswered for `timeout`, or sooner once a probe
  /// has gone unanswered for kListenerCheckAfter and either `listener` finds nothing
  /// listening at its address (a killed node that has not come back) or the listener
  /// answers that it does not know the connection (a node that restarted: the
  /// question is a Hello with kVerifyMagic, ofi_wire.hpp, asked where the peer
  /// `answers_questions`).
  PeerProbe(std::shared_ptr<Endpoint> ep, fi_addr_t peer, uint32_t id, uint64_t nonce,
            std::chrono::milliseconds timeout, std::optional<ListenerCheck> listener = std::nullopt,
            bool answers_questions = false);
  ~PeerProbe();
  PeerProbe(const PeerProbe&) = delete;
  PeerProbe& operator=(const PeerProbe&) = delete;

  /// Something came from the peer (a message, a body): it is alive now.
  void heard();
  /// Called while a call waits on the peer (from its wait's predicate, so at least
  /// every 5 ms): sends a probe when the peer has been silent for a quarter of the
  /// timeout, and answers unavailable once a probe went unanswered for the timeout.
  /// Several threads may call it at once (one sending, one receiving).
  Status check();

 private:
  using Clock = transport::Clock;
  std::shared_ptr<Endpoint> ep_;
  fi_addr_t peer_;
  uint32_t id_;
  uint64_t nonce_;
  std::chrono::milliseconds timeout_;
  std::optional<ListenerCheck> listener_;
  bool answers_questions_;
  std::mutex mu_;
  std::shared_ptr<std::atomic<int64_t>> heard_at_;  // steady-clock ns; the answer's receive sets it too
  std::shared_ptr<Op> answer_op_;   // posted receive for the outstanding probe's answer
  uint64_t seq_ = 0;                // probes sent
  bool injected_ = false;           // the outstanding probe is with the provider
  Clock::time_point probe_sent_{};  // when it went out
  bool listener_checked_ = false;   // the outstanding probe's listener check is done
  bool asked_ = false;              // the outstanding probe's question went out
  std::shared_ptr<std::atomic<bool>> unknown_;  // the listener said it does not know the connection
  std::shared_ptr<Op> unknown_op_;  // receive for that answer, posted with the first question
  Status gone_;                     // a verdict of the checks, for every caller after

  /// Asks the listener whether it knows this connection (mu_ held); false when the
  /// provider had no room (asked again on the next check).
  bool ask_listener();
};

}  // namespace kvstream::transport::ofi
