// One connection of the storage node's client (client_channel.hpp).
#include "storage/client_channel.hpp"

#include "core/log.hpp"
#include "transport/common/random_fill.hpp"

namespace kvstream::storage::client_detail {

using namespace std::chrono_literals;
using transport::Clock;
using transport::Deadline;
using transport::deadline_in;
using transport::MemoryRegion;

bool resendable(const Request& req) {
  switch (req.op) {
    case Op::get:
    case Op::stat:
    case Op::list:
    case Op::usage:
      return true;
    case Op::put:
    case Op::touch:
      return req.version != 0;  // without a version or stamp the node would apply it twice
    case Op::remove:  // twice, one without a version would remove a newer write
      return (req.flags & kRemoveBatch) || ((req.flags & kRemoveUpTo) && req.version != 0);
    default:
      return false;
  }
}

Channel::Channel(std::unique_ptr<transport::Connection> c, transport::Backend* backend, Replay replay,
                 uint64_t first_id, std::shared_ptr<MembersLink> members)
    : conn_(std::move(c)),
      backend_(backend),
      replay_(std::move(replay)),
      members_(std::move(members)),
      next_id_(first_id) {
  if (next_id_ == 0) {
    if (!transport::random_fill(&next_id_, sizeof next_id_))  // no entropy: from the clock
      next_id_ = uint64_t(Clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
    next_id_ = (next_id_ >> 1) | 1;  // far from wrapping round, never 0
  }
  receiver_ = std::thread([this] {
    receive_loop();
    finished_.store(true, std::memory_order_release);
  });
}

Channel::~Channel() {
  stop_.cancel();
  if (receiver_.joinable()) receiver_.join();
  fail_all(make_status(StatusCode::cancelled, "client closed"));
}

void Channel::submit(Request req, std::span<const std::byte> body, Pending p) {
  auto done = p.done;
  // A request that is already over never reaches the wire (and cannot break it).
  if (p.cancel.cancelled()) return done(make_status(StatusCode::cancelled, "request cancelled"), {});
  if (Clock::now() >= p.deadline) return done(make_status(StatusCode::timed_out, "request past its deadline"), {});
  uint64_t id = 0;
  std::vector<std::byte> header;
  {
    std::unique_lock lock(mu_);
    if (!broken_.ok()) {
      // Lost since the client picked it: a request that may go twice goes on a
      // fresh connection, as if it had been sent.
      const Status why = broken_;
      lock.unlock();
      if (why.code() == StatusCode::unavailable && !p.replayed && resendable(req)) {
        p.replayed = true, p.replay_body = body;
        return replay_(std::move(req), std::move(p), why);
      }
      return done(why, {});
    }
    id = req.id = next_id_++;
    header = encode(req);
    p.members_revision = (req.flags & kMembersRevision) ? req.members_revision : 0;
    // Kept for a resend (moved: the header is encoded already).
    if (!p.replayed && resendable(req)) {
      p.replay_body = body;
      p.replay = std::move(req);
    }
    pending_.emplace(id, std::move(p));
  }
  Status st;
  {
    std::lock_guard lock(send_mu_);
    st = send_segmented(*conn_, header, body, [id](uint32_t i) { return data_request_header(id, i); },
                        pending_deadline(id), stop_);
  }
  if (!st.ok()) {
    mark_broken(st);
    // The node closed the connection as this went out (its idle timeout): sent
    // again like a request waiting for its answer.
    if (st.code() == StatusCode::unavailable) lose(id, st.with_context("storage connection lost"));
    else complete(id, st, {});
  }
}

bool Channel::alive() {
  std::lock_guard lock(mu_);
  return broken_.ok();
}

Deadline Channel::pending_deadline(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = pending_.find(id);
  return it == pending_.end() ? Clock::now() : it->second.deadline;
}

void Channel::mark_broken(const Status& s) {
  std::lock_guard lock(mu_);
  if (broken_.ok()) broken_ = s;
}

// Completes request `id` (if still waiting) outside the lock.
void Channel::complete(uint64_t id, Result<size_t> r, std::vector<std::byte>&& body) {
  Done done;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    if (!it->second.abandoned) done = std::move(it->second.done);
    pending_.erase(it);
  }
  if (done) done(std::move(r), std::move(body));
}

// Ends a request taken out of pending_ with `s`, or (`resend`: its connection was
// lost, and it may go again) hands it to replay_, which sends it on a fresh one.
// Whether it ended here (a request already over counts as not).
bool Channel::finish(Pending p, const Status& s, bool resend) {
  if (p.abandoned || !p.done) return false;
  // A request its caller cancelled, or whose deadline passed, ends as such, whatever
  // became of its connection meanwhile (as expire() would have ended it).
  if (p.cancel.cancelled()) {
    p.done(make_status(StatusCode::cancelled, "request cancelled"), {});
    return true;
  }
  if (Clock::now() >= p.deadline) {
    p.done(make_status(StatusCode::timed_out, "request past its deadline"), {});
    return true;
  }
  if (resend && p.replay) {
    Request again = std::move(*p.replay);
    p.replay.reset(), p.replayed = true;
    replay_(std::move(again), std::move(p), s);
    return false;
  }
  p.done(s, {});
  return true;
}

// Request `id`, whose send met the loss `s`.
void Channel::lose(uint64_t id, const Status& s) {
  std::optional<Pending> p;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    p = std::move(it->second);
    pending_.erase(it);
  }
  finish(std::move(*p), s, true);
}

// Fails every request still waiting with `s`; how many ended here. `resend`: the
// connection was lost, and those that may go again do (finish).
size_t Channel::fail_all(const Status& s, bool resend) {
  std::map<uint64_t, Pending> all;
  {
    std::lock_guard lock(mu_);
    all.swap(pending_);
  }
  size_t failed = 0;
  for (auto& [id, p] : all) failed += finish(std::move(p), s, resend);
  return failed;
}

// Requests past their deadline or cancelled complete now; the slot stays so their
// response, if it ever comes, is recognised and its body discarded.
void Channel::expire() {
  std::vector<std::pair<Done, Status>> due;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    for (auto& [id, p] : pending_) {
      if (p.abandoned) continue;
      if (p.cancel.cancelled())
        due.emplace_back(std::move(p.done), make_status(StatusCode::cancelled, "request {} cancelled", id));
      else if (now >= p.deadline)
        due.emplace_back(std::move(p.done), make_status(StatusCode::timed_out, "request {} passed its deadline", id));
      else
        continue;
      p.abandoned = true;
      p.dest = {};
    }
  }
  for (auto& [done, st] : due) done(st, {});
}

void Channel::receive_loop() {
  std::vector<std::byte> header;
  while (!stop_.cancelled()) {
    expire();
    // Short waits so deadlines and cancels are seen promptly.
    auto len = conn_->recv_header(header, deadline_in(20ms), stop_);
    if (!len.ok()) {
      if (len.status().code() == StatusCode::timed_out) continue;
      if (len.status().code() == StatusCode::cancelled) return;
      mark_broken(len.status());
      // The transport logs a node that closed between two messages at debug only
      // (transport/common/peer_closed.hpp); here it cost requests, which is worth
      // a warning.
      if (const size_t n = fail_all(len.status().with_context("storage connection lost"), true); n > 0)
        KVS_LOG_WARN("storage client: {} lost with {} requests waiting: {}", conn_->describe(), n,
                     len.status().to_string());
      return;
    }
    auto resp = decode_response(header);
    if (!resp.ok()) {
      mark_broken(resp.status());
      fail_all(resp.status().with_context("malformed response"));
      return;
    }
    Status st = land(*resp, *len);
    if (!st.ok()) {
      mark_broken(st);
      // Lost mid-body: the requests go again (a body that arrived garbled, or a
      // malformed message, fails them: the node answered).
      const bool lost = st.code() == StatusCode::unavailable;
      fail_all(lost ? st.with_context("storage connection lost") : st, lost);
      return;
    }
  }
}

// Receives the body of `r` into its request's destination and completes it.
Status Channel::land(const Response& r, size_t len) {
  MemoryRegion dest;
  size_t offset = 0, capacity = 0;
  bool known = false, abandoned = false, range = false;
  Op op = Op::get;
  int64_t members_revision = 0;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(r.id);
    if (it != pending_.end()) {
      known = true;
      abandoned = it->second.abandoned;
      dest = it->second.dest;
      offset = it->second.offset, capacity = it->second.capacity;
      op = it->second.op, range = it->second.range;
      members_revision = it->second.members_revision;
    }
  }
  if (!known) return make_status(StatusCode::corrupt_data, "response to unknown request {}", r.id);
  // The node echoes each request's op: an answer to another kind of request under
  // this id is another connection's (a transport that let a message of a dead
  // connection into this one), and neither it nor what follows can be trusted.
  if (r.op != op)
    return make_status(StatusCode::corrupt_data, "the answer to request {} (op {}) is one to op {}", r.id, int(op),
                       int(r.op));
  // Whatever the answer, a node whose member set is newer than the one the request
  // named says so (members_link.hpp).
  if (r.members_newer && members_revision > 0 && members_) members_->node_is_newer(members_revision);
  const auto body_deadline = deadline_in(30s);
  if (op == Op::get && r.code == StatusCode::ok) return land_get(r, len, abandoned, dest, offset, capacity, range);
  if (abandoned || r.code != StatusCode::ok) {
    KVS_RETURN_IF_ERROR(conn_->recv_body({}, body_deadline, stop_));  // discard
    complete(r.id, r.code == StatusCode::ok ? Status{} : make_status(r.code, "{}", r.message), {});
    return {};
  }
  // Small bodies (stat, list) go through a buffer of our own.
  if (len > (size_t(64) << 20)) return make_status(StatusCode::corrupt_data, "response body of {} bytes", len);
  std::vector<std::byte> body(len);
  if (len) {
    KVS_ASSIGN_OR_RETURN(auto mr, backend_->register_memory(body.data(), len, transport::MemoryType::host));
    KVS_RETURN_IF_ERROR(conn_->recv_body(mr.span(0, len), body_deadline, stop_));
  } else {
    KVS_RETURN_IF_ERROR(conn_->recv_body({}, body_deadline, stop_));
  }
  if (body_checksum(body) != r.checksum) {
    complete(r.id, make_status(StatusCode::corrupt_data, "response failed its checksum in transit"), {});
    return {};
  }
  complete(r.id, len, std::move(body));
  return {};
}

// A get's body: its first segment came with the response, the others follow as
// `data` messages; each lands at its place in the destination (or is discarded when
// the request is over or the buffer too small, or a range's body is not the range's
// size), and the whole is checked once.
Status Channel::land_get(const Response& r, size_t first_len, bool abandoned, const MemoryRegion& dest, size_t offset,
                         size_t capacity, bool range) {
  const uint64_t total = r.total;
  const bool fits = range ? total == capacity : total <= capacity;
  const bool keep = !abandoned && fits;
  // Every segment has its own place in the destination, so the receives of the next
  // kGetPostAhead go out ahead of their headers (a transport that holds a body for its
  // receiver, libfabric over ofi_rxm, then sends it without waiting for this loop).
  // Only this thread completes requests, so the destination stays the caller's until
  // the body has landed or the posts are withdrawn.
  constexpr uint64_t kGetPostAhead = 8;
  KVS_RETURN_IF_ERROR(recv_segmented(
      *conn_, false, r.id, total, first_len,
      [&](uint64_t i, uint64_t len) { return keep ? dest.span(offset + i * kSegmentBytes, len) : std::span<std::byte>(); },
      [](std::span<std::byte>) {}, 30s, stop_, kGetPostAhead));
  if (abandoned) {
    complete(r.id, Status{}, {});
    return {};
  }
  if (!keep) {
    complete(r.id,
             range ? make_status(StatusCode::corrupt_data, "the node answered a range of {} bytes with {}", capacity,
                                 total)
                   : make_status(StatusCode::out_of_range, "chunk of {} bytes, buffer of {}", total, capacity),
             {});
    return {};
  }
  if (body_checksum(dest.span(offset, total)) != r.checksum) {
    complete(r.id, make_status(StatusCode::corrupt_data, "chunk failed its checksum in transit"), {});
    return {};
  }
  complete(r.id, size_t(total), {});
  return {};
}

}  // namespace kvstream::storage::client_detail
