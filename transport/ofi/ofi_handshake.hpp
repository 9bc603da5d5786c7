// The hello / hello-ack handshake that builds a connection on connectionless RDM
// endpoints. A client opens its own endpoint, inserts the listener's address, posts
// a receive for its ack and sends a hello carrying its own address and a nonce; the
// listener's accept() inserts that address, assigns the connection an id and answers
// with a hello-ack (tagged with the nonce) carrying the id.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "transport/ofi/ofi_connection.hpp"
#include "transport/ofi/ofi_reachability.hpp"

namespace kvstream::transport::ofi {

// ---- Listener side -----------------------------------------------------------------

/// The valid hellos the listener's receives took, waiting for accept().
struct HelloQueue {
  /// A client asking whether connection `id` is still known (kVerifyMagic).
  struct Verify {
    Hello hello;
    uint32_t id;
  };
  /// Questions kept for accept() at most; more are dropped (the client asks again).
  static constexpr size_t kMaxVerifies = 64;

  std::mutex mu;
  std::deque<Hello> hellos;
  std::deque<Verify> verifies;
  /// Receives that ended without a hello (junk under the hello's tag, an error): the
  /// listener reposts them without waiting for a valid hello, so that junk cannot
  /// use up every posted receive and stop it accepting.
  size_t spent = 0;
  bool closing = false;  // the listener is going away: take no more
};

/// Posts one hello receive on `ep`; its completion queues a valid hello or question
/// in `queue`, or counts the receive as spent.
Result<std::shared_ptr<Op>> post_hello_recv(Endpoint& ep, const std::shared_ptr<HelloQueue>& queue);

/// How long a taken hello's ack may take to complete before the handshake is dropped.
inline constexpr auto kHandshakeLimit = std::chrono::seconds(10);

/// A connection whose hello was taken and whose hello-ack has not completed yet.
struct Handshake {
  std::unique_ptr<OfiConnection> conn;
  std::shared_ptr<Op> ack;
  void* desc = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  uint64_t tag = 0;
  uint32_t id = 0;
  bool posted = false;  // the ack is with the provider
  Deadline give_up{};   // kHandshakeLimit after the hello was taken
  // The ack's next post attempt while the provider refuses it (EAGAIN: over ofi_rxm,
  // while it connects to the client, or tries to reach one that is gone), spaced by
  // a gap that doubles up to 1 ms in the first 100 ms, up to 20 ms after.
  Deadline retry_at{};
  Clock::duration retry_gap{};

  /// The ack was posted and has completed (well or not).
  [[nodiscard]] bool acked() const { return posted && ack->done.load(std::memory_order_acquire); }
};

/// Makes the connection `hello` asks for, as connection `id` on the listener's
/// endpoint, whose probes `responder` answers, and prepares its ack.
Result<std::unique_ptr<Handshake>> begin_handshake(const std::shared_ptr<Endpoint>& ep, const Hello& hello,
                                                   uint32_t id, const std::shared_ptr<ProbeResponder>& responder);

/// Answers a client's question about connection `v.id` from the listener's endpoint
/// `ep`: nothing where `responder` knows it, else "unknown" (best effort: a client
/// that hears nothing asks again at its next probe).
void answer_verify(Endpoint& ep, const ProbeResponder& responder, const HelloQueue::Verify& v);

/// One step of a taken hello's handshake, without waiting: posts the ack where the
/// provider has not taken it yet (one attempt, when its retry is due), then says
/// whether it completed. A listener steps every pending handshake in turn, so a
/// client that cannot be reached (gone before its ack, or a hello naming an address
/// where nothing listens) holds up none of the others. Errors (the handshake is over):
/// unavailable once the ack failed, or kHandshakeLimit passed without it completing.
Result<bool> step_handshake(Endpoint& ep, Handshake& hs);
/// Whether step_handshake has something to do now: the ack completed, its post is due,
/// or kHandshakeLimit has passed.
[[nodiscard]] bool handshake_due(const Handshake& hs, Clock::time_point now);

// ---- Client side -------------------------------------------------------------------

/// What a client's hello made: the connection id the listener assigned, the hello's
/// nonce (its liveness probes carry it), and whether the listener answers questions
/// about its connections (kAnswersQuestions).
struct Greeted {
  uint32_t id = 0;
  uint64_t nonce = 0;
  bool answers_questions = false;
  /// The endpoint's hold on `id` (ofi_strays.hpp), for the connection to take over:
  /// taken before the handshake's hold was let go, so that what the listener sends
  /// first is never swept.
  Endpoint::Expectation hold;
};

/// An operation whose buffer holds a Hello from `ep` (its address), with `magic`
/// (kHelloMagic, or kVerifyMagic for a question) and `nonce`. Errors: internal (an
/// address longer than a Hello holds), or fi_getname's.
Result<std::shared_ptr<Op>> hello_op(Endpoint& ep, uint32_t magic, uint64_t nonce);

/// Says hello from `ep` to the listener at `server` (`address` names it in errors)
/// and waits for its ack. Where the provider has not taken the hello after
/// kListenerCheckAfter, `listener` (if any) looks once whether anything listens
/// there; nothing does: unavailable (ofi_reachability.hpp).
Result<Greeted> say_hello(Endpoint& ep, fi_addr_t server, const std::string& address, Deadline deadline,
                          const CancelToken& cancel, const ListenerCheck* listener = nullptr);

}  // namespace kvstream::transport::ofi
