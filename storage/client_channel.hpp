// One connection of the storage node's client: requests pipelined over it, a
// receiver thread that matches responses to requests by id and lands each chunk
// straight in the caller's registered buffer, its checksum verified first.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "storage/members_link.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage::client_detail {

/// Completion of one request: the body's size (a get: bytes landed) and, for a small
/// response (stat, list, usage), its bytes.
using Done = std::function<void(Result<size_t>, std::vector<std::byte>&&)>;

/// One outstanding request.
struct Pending {
  Op op = Op::get;
  transport::MemoryRegion dest;  // where the body lands (get), or empty
  size_t offset = 0, capacity = 0;
  bool range = false;  // a range get: the body must be exactly `capacity` bytes
  transport::Deadline deadline;
  transport::CancelToken cancel;
  Done done;
  bool abandoned = false;  // completed early (deadline/cancel): its late body is discarded
  // A request the node may get twice without harm is sent again once, on a fresh
  // connection, when its connection is lost under it: a read (get, range get, stat,
  // list, usage), a put (it carries its write version: the node keeps one write of a
  // version, and the client tells a refusal of its own first try from a newer write,
  // ClientImpl::replay), a touch (its stamp; marks keep the highest) and a remove
  // that carries its version (kRemoveUpTo: a write made between the two tries is
  // newer and stays; a node from before that is not sent one twice). A runtime's
  // fetches and stores then survive a node closing an idle connection, or
  // restarting, as they were sent.
  std::optional<Request> replay;
  std::span<const std::byte> replay_body;  // the caller's, who waits for `done`
  bool replayed = false;
  int64_t members_revision = 0;  // the member-set revision the request named (kMembersRevision), or 0
};

/// Whether a request may be sent again after its connection was lost (Pending::replay).
[[nodiscard]] bool resendable(const Request& req);

/// Where a channel hands the requests it can send again (Pending::replay) when its
/// connection is lost (why: the loss).
using Replay = std::function<void(Request, Pending, const Status& why)>;

/// A connection, its requests in flight and their receiver.
class Channel {
 public:
  /// Request ids count up from `first_id` (first_request_id, for a node that takes
  /// only its window of them), or from a random start where it is 0.
  /// `members` (may be null) hears of the answers that say the node's member set is
  /// newer than the one their request named (members_link.hpp).
  Channel(std::unique_ptr<transport::Connection> c, transport::Backend* backend, Replay replay, uint64_t first_id = 0,
          std::shared_ptr<MembersLink> members = nullptr);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Sends a request; `p.done` runs exactly once (on this thread, the receiver's, or
  /// the thread the request is handed to for its resend).
  void submit(Request req, std::span<const std::byte> body, Pending p);

  [[nodiscard]] bool alive();
  /// Its receiver thread has returned (the connection broke, or it was stopped).
  [[nodiscard]] bool finished() const { return finished_.load(std::memory_order_acquire); }

 private:
  std::unique_ptr<transport::Connection> conn_;
  transport::Backend* backend_;
  Replay replay_;
  std::shared_ptr<MembersLink> members_;
  transport::CancelToken stop_;
  std::thread receiver_;
  std::mutex send_mu_, mu_;
  std::map<uint64_t, Pending> pending_;
  // Request ids start anew on each connection (from the node's hello, or at random):
  // an answer meant for a request of another connection (a transport that let a dead
  // connection's message into this one) then names no request here and is refused,
  // instead of completing this connection's request of the same number with another
  // request's answer (a get, another chunk's bytes under their own valid checksum).
  uint64_t next_id_;
  Status broken_;
  std::atomic<bool> finished_{false};

  transport::Deadline pending_deadline(uint64_t id);
  void mark_broken(const Status& s);
  void complete(uint64_t id, Result<size_t> r, std::vector<std::byte>&& body);
  bool finish(Pending p, const Status& s, bool resend);
  void lose(uint64_t id, const Status& s);
  size_t fail_all(const Status& s, bool resend = false);
  void expire();
  void receive_loop();
  Status land(const Response& r, size_t len);
  Status land_get(const Response& r, size_t first_len, bool abandoned, const transport::MemoryRegion& dest,
                  size_t offset, size_t capacity, bool range);
};

}  // namespace kvstream::storage::client_detail
