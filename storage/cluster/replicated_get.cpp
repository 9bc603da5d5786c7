// A replicated client's gets (replicated_client.hpp): the chunk's owners ranked best
// first, one attempt at a time with a share of the time left, failover on a stall or
// a lost node, the owners under past placements, and a second try under a newer member
// set where a node said the client's is behind.
#include <algorithm>
#include <tuple>

#include "core/log.hpp"
#include "storage/cluster/replicated_client.hpp"
#include "storage/cluster/write_outcome.hpp"
#include "storage/protocol.hpp"

namespace kvstream::cluster {

using transport::CancelToken;
using transport::Clock;
using transport::Deadline;
using transport::MemoryRegion;

void ReplicatedClient::get_async(const std::string& context, uint32_t chunk, uint32_t level, MemoryRegion dest,
                                 size_t offset, size_t capacity, Deadline deadline, const CancelToken& cancel,
                                 GetCallback done) {
  if (Status s = storage::validate_id(context, storage::kMaxContextBytes, "context id"); !s.ok()) return done(s);
  if (capacity > 0 && (!dest.valid() || dest.span(offset, capacity).size() != capacity))
    return done(make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                            offset, offset + capacity));
  auto op = std::make_shared<GetOp>();
  op->context = context, op->chunk = chunk, op->level = level;
  op->dest = std::move(dest), op->offset = offset, op->capacity = capacity;
  op->deadline = deadline, op->cancel = cancel, op->done = std::move(done);
  start_order(*op, HashRing::chunk_key(context, chunk), capacity);
  attempt(std::move(op));
}

void ReplicatedClient::get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset,
                                       uint64_t length, MemoryRegion dest, size_t dest_offset, Deadline deadline,
                                       const CancelToken& cancel, GetCallback done) {
  if (Status s = storage::validate_id(context, storage::kMaxContextBytes, "context id"); !s.ok()) return done(s);
  if (length == 0) return done(make_status(StatusCode::invalid_argument, "a range of 0 bytes"));
  if (!dest.valid() || dest.span(dest_offset, length).size() != length)
    return done(make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                            dest_offset, dest_offset + length));
  auto op = std::make_shared<GetOp>();
  op->context = context, op->chunk = chunk, op->level = level;
  op->dest = std::move(dest), op->offset = dest_offset, op->capacity = size_t(length);
  op->range = true, op->range_offset = offset;
  op->deadline = deadline, op->cancel = cancel, op->done = std::move(done);
  start_order(*op, HashRing::chunk_key(context, chunk), length);
  attempt(std::move(op));
}

void ReplicatedClient::start_order(GetOp& op, std::string key, uint64_t bytes) {
  op.view = view();
  op.key = std::move(key);
  op.order = rank(op.view->now->replicas(op.key, op.view->replication), bytes);
}

std::vector<ClusterNode*> ReplicatedClient::rank(std::vector<Node*> replicas, uint64_t bytes) {
  const auto now = Clock::now();
  std::vector<std::tuple<bool, double, size_t, Node*>> keyed;
  for (size_t i = 0; i < replicas.size(); ++i) {
    Node& n = *replicas[i];
    const bool connected = links_.client_of(n) != nullptr;
    keyed.emplace_back(!connected || n.health.down(now), n.health.expected_seconds(bytes), i, replicas[i]);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<Node*> out;
  for (auto& k : keyed) out.push_back(std::get<3>(k));
  return out;
}

Deadline ReplicatedClient::attempt_deadline(Deadline deadline, size_t left) const {
  const auto now = Clock::now();
  if (now >= deadline || left <= 1) return deadline;
  const auto remaining = deadline - now;
  auto share = remaining / left;
  share = std::max<Clock::duration>(share, cfg_.min_attempt);
  return now + std::min<Clock::duration>(share, remaining);
}

void ReplicatedClient::finish(const std::shared_ptr<GetOp>& op, Result<size_t> r) {
  auto done = std::move(op->done);
  op->dest = {};
  done(std::move(r));
}

void ReplicatedClient::attempt(std::shared_ptr<GetOp> op) {
  while (true) {
    if (op->cancel.cancelled()) return finish(op, make_status(StatusCode::cancelled, "get cancelled"));
    if (links_.closing()) return finish(op, make_status(StatusCode::cancelled, "client closed"));
    if (Clock::now() >= op->deadline)
      return finish(op, make_status(StatusCode::timed_out, "chunk {} level {} of '{}': deadline passed{}{}",
                                    op->chunk, op->level, op->context, op->errors.empty() ? "" : " after ",
                                    op->errors));
    if (op->next >= op->order.size() && !op->asked_past) {
      op->asked_past = true;
      op->view->append_past_owners(op->key, op->order);
      continue;
    }
    if (op->next >= op->order.size()) {
      if (op->only_not_found) {
        if (catch_up(op)) return;
        return finish(op, nowhere(*op));
      }
      return finish(op, Status(op->last_error.code(),
                               fmt::format("chunk {} level {} of '{}': every replica failed: {}", op->chunk,
                                           op->level, op->context, op->errors)));
    }
    // Replicas left that can be asked (connected): the time is shared among them.
    size_t left = 0;
    for (size_t i = op->next; i < op->order.size(); ++i) left += links_.client_of(*op->order[i]) != nullptr;
    Node& n = *op->order[op->next++];
    auto c = links_.client_of(n);
    if (!c) {
      note_failure(*op, n, not_connected());
      continue;
    }
    const Deadline until = attempt_deadline(op->deadline, left);
    const auto t0 = Clock::now();
    n.health.started(op->capacity);
    auto then = [this, op, np = &n, cp = c.get(), t0, until](Result<size_t> r) mutable {
      on_attempt(std::move(op), *np, cp, t0, until, std::move(r));
    };
    if (op->range)
      c->get_range_async(op->context, op->chunk, op->level, op->range_offset, op->capacity, op->dest,
                         op->offset, until, op->cancel, std::move(then));
    else
      c->get_async(op->context, op->chunk, op->level, op->dest, op->offset, op->capacity, until,
                   op->cancel, std::move(then));
    return;
  }
}

Status ReplicatedClient::nowhere(const GetOp& op) {
  return make_status(StatusCode::not_found, "chunk {} level {} of '{}' is on none of its {} replicas", op.chunk,
                     op.level, op.context, op.order.size());
}

bool ReplicatedClient::catch_up(const std::shared_ptr<GetOp>& op) {
  if (!catch_up_ || op->asked_again) return false;
  if (view() != op->view) {
    ask_again(op);
    return true;
  }
  op->asked_again = true;
  if (!catch_up_->recent_failure(kCatchUpBackoff).ok()) return false;  // etcd out of reach: not_found now
  return catch_up_->request(set_link_->newer_than_told(), [this, op](const Status& read) {
    if (read.code() == StatusCode::cancelled) return finish(op, read);
    if (!read.ok() || view() == op->view || Clock::now() >= op->deadline) return finish(op, nowhere(*op));
    ask_again(op);
  });
}

void ReplicatedClient::ask_again(const std::shared_ptr<GetOp>& op) {
  op->asked_again = true;
  op->view = view();
  op->order = rank(op->view->now->replicas(op->key, op->view->replication), op->capacity);
  op->next = 0;
  op->asked_past = false;
  attempt(op);
}

void ReplicatedClient::note_failure(GetOp& op, const Node& n, const Status& s) {
  op.errors += fmt::format("{}{}: {}", op.errors.empty() ? "" : "; ", n.address, s.to_string());
  if (s.code() != StatusCode::not_found) {
    op.only_not_found = false;
    op.last_error = s;
  }
}

void ReplicatedClient::on_attempt(std::shared_ptr<GetOp> op, Node& n, storage::Client* c, Clock::time_point t0,
                                  Deadline until, Result<size_t> r) {
  const auto now = Clock::now();
  if (r.ok()) {
    n.health.succeeded(op->capacity, seconds_between(t0, now), *r);
    return finish(op, std::move(r));
  }
  const Status s = r.status();
  const bool stalled = s.code() == StatusCode::timed_out && until < op->deadline;
  n.health.failed(op->capacity, stalled ? seconds_between(t0, now) : 0);
  if (final_error(s.code()) || (s.code() == StatusCode::cancelled && op->cancel.cancelled()) ||
      (s.code() == StatusCode::timed_out && !stalled)) {
    return finish(op, s);
  }
  if (stalled) {
    n.health.mark_down(now + cfg_.retry_down_after);
    KVS_LOG_WARN("cluster: node {} stalled past its share of the deadline; trying another replica", n.address);
  } else if (s.code() == StatusCode::unavailable || s.code() == StatusCode::corrupt_data) {
    links_.retire(n, c, s);
  }
  note_failure(*op, n, s);
  attempt(std::move(op));
}

}  // namespace kvstream::cluster
