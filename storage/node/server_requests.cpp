// A storage node's connection after its login (server_impl.hpp): its requests in
// order, each answered, and the bodies of puts, touches and batches of removes read
// off the wire whole, so a refused request leaves the connection in step.
#include <limits>
#include <new>
#include <optional>

#include "core/log.hpp"
#include "storage/cluster/rebalancer.hpp"
#include "storage/node/server_impl.hpp"

namespace kvstream::storage {

using transport::CancelToken;
using transport::Connection;
using transport::deadline_in;

void ServerImpl::serve(Connection& c, const CancelToken& handshake, const CancelToken& cancel,
                       PreAuthPool::Ticket& ticket) {
  auto login = authenticate(c, handshake, ticket);
  ticket.release();
  if (!login.ok()) {
    if (login.status().code() != StatusCode::cancelled || !stop_.cancelled())
      login_log_.note(login.status().to_string());
    return;
  }
  const std::string& ns = login->ns;
  struct Release {  // the namespace's connection slot, held while this connection lives
    ServerImpl* self;
    std::string ns;
    ~Release() { self->release_namespace(ns); }
  } release{this, login->ns};
  std::vector<std::byte> header;
  while (!cancel.cancelled()) {
    auto body_len = c.recv_header(header, deadline_in(cfg_.idle_timeout), cancel);
    if (!body_len.ok()) {
      if (body_len.status().code() != StatusCode::cancelled && body_len.status().code() != StatusCode::unavailable)
        conn_log_.note(fmt::format("{}: {}", c.describe(), body_len.status().to_string()));
      return;
    }
    ++requests_;
    auto req = decode_request(header);
    const bool has_body = req.ok() && (req->op == Op::put || req->op == Op::touch ||
                                       (req->op == Op::remove && (req->flags & kRemoveBatch)));
    const bool bad_body = req.ok() && (has_body ? *body_len != segment_bytes(req->total, 0) : *body_len != 0);
    // An id outside the connection's window is another connection's request (a
    // dead connection's message let in by the transport): not done here.
    const bool foreign = req.ok() && !request_id_in_window(req->id, login->first_id);
    if (!req.ok() || bad_body || foreign || req->op == Op::auth || req->op == Op::data) {
      // A malformed request ends the connection: its framing can no longer be trusted.
      ++errors_;
      Response r;
      r.code = req.ok() ? StatusCode::corrupt_data : req.status().code();
      r.message = !req.ok()  ? req.status().message()
                  : foreign ? fmt::format("request id {} is none of this connection's", req->id)
                            : "request out of place or with a body of the wrong size";
      if (req.ok()) r.op = req->op, r.id = req->id;
      (void)reply(c, r, deadline_in(cfg_.idle_timeout), cancel);
      conn_log_.note(fmt::format("closing {}: {}", c.describe(), r.message));
      return;
    }
    Status st;
    try {
      st = handle(c, ns, *req, cancel);
    } catch (const std::bad_alloc&) {
      // Every buffer of a request comes from the budget; this is the system itself
      // running short. The connection goes, the node stays.
      st = make_status(StatusCode::resource_exhausted, "out of memory serving a request");
    }
    if (!st.ok()) {
      conn_log_.note(fmt::format("{}: {}", c.describe(), st.to_string()));
      return;
    }
  }
}

template <typename Apply>
Status ServerImpl::receive_small_body(Connection& c, const Request& req, const CancelToken& cancel, Status& outcome,
                                      Apply apply) {
  SegmentPool::Segment seg;
  if (auto s = segments_->acquire(); s.ok()) seg = std::move(s).value();
  else outcome = s.status();
  std::span<std::byte> body;
  KVS_RETURN_IF_ERROR(recv_segmented(
      c, true, req.id, req.total, segment_bytes(req.total, 0),
      [&](uint64_t, uint64_t len) { return outcome.ok() ? (body = seg.span(len)) : std::span<std::byte>(); },
      [](std::span<std::byte>) {}, cfg_.idle_timeout, cancel));
  bytes_in_ += req.total;
  if (outcome.ok() && body_checksum(body) != req.checksum)
    outcome = make_status(StatusCode::corrupt_data, "request body failed its checksum");
  if (outcome.ok()) outcome = apply(std::span<const std::byte>(body));
  return {};
}

Status ServerImpl::handle(Connection& c, const std::string& ns, const Request& req, const CancelToken& cancel) {
  Response r;
  r.op = req.op;
  r.id = req.id;
  r.members_newer = members_newer(req);
  std::vector<std::byte> small;
  auto fail = [&](const Status& s) {
    ++errors_;
    r.code = s.code();
    r.message = s.message();
  };
  switch (req.op) {
    case Op::put: {
      Status outcome;
      KVS_RETURN_IF_ERROR(receive_put(c, ObjectKey{ns, req.context, req.chunk, req.level}, req, cancel, outcome));
      if (!outcome.ok()) fail(outcome);
      break;
    }
    case Op::get:
      return send_get(c, ObjectKey{ns, req.context, req.chunk, req.level}, req, r, cancel);
    case Op::stat: {
      auto s = store_->stat(ns, req.context, /*hide_fenced=*/true);
      if (s.ok()) small = encode_stats(*s, req.flags & kStatVersions);
      else fail(s.status());
      break;
    }
    case Op::remove:
      if (req.flags & kRemoveBatch) {
        Status outcome;
        KVS_RETURN_IF_ERROR(receive_small_body(c, req, cancel, outcome, [&](std::span<const std::byte> body) {
          auto removes = decode_removes(body);
          return removes.ok() ? store_->remove_many(ns, *removes) : removes.status();
        }));
        if (!outcome.ok()) fail(outcome);
      } else if (Status s = store_->remove(ns, req.context,
                                    (req.flags & kRemoveUpTo) ? req.version : std::numeric_limits<uint64_t>::max());
          !s.ok())
        fail(s);
      break;
    case Op::list:
      small = encode_names(store_->list(ns, /*hide_fenced=*/true));
      break;
    case Op::touch: {
      Status outcome;
      KVS_RETURN_IF_ERROR(receive_small_body(c, req, cancel, outcome, [&](std::span<const std::byte> body) {
        auto touches = decode_touches(body);
        return touches.ok() ? store_->touch(ns, *touches, req.version).status() : touches.status();
      }));
      if (!outcome.ok()) fail(outcome);
      break;
    }
    case Op::usage:
      small = encode_usage(store_->usage(ns, req.context, req.after, req.chunk));
      break;
    default:
      fail(make_status(StatusCode::invalid_argument, "unexpected request"));
  }
  if (r.code != StatusCode::ok) small.clear();
  r.checksum = body_checksum(small);
  const auto deadline = deadline_in(cfg_.idle_timeout);
  if (small.empty()) return reply(c, r, deadline, cancel);
  KVS_ASSIGN_OR_RETURN(auto mr, backend_->register_memory(small.data(), small.size(), transport::MemoryType::host));
  KVS_RETURN_IF_ERROR(c.send(encode(r), mr.span(0, small.size()), deadline, cancel));
  bytes_out_ += small.size();
  return {};
}

bool ServerImpl::members_newer(const Request& req) {
  if (!(req.flags & kMembersRevision)) return false;
  std::lock_guard lock(writes_mu_);
  if (!write_watch_) return false;
  const int64_t mine = write_watch_->members_revision();
  if (req.members_revision > mine) write_watch_->heard_of_newer_members(req.members_revision);
  return mine > req.members_revision;
}

Status ServerImpl::receive_put(Connection& c, const ObjectKey& key, const Request& req, const CancelToken& cancel,
                               Status& outcome) {
  Status& st = outcome;
  // Two segments where the put has more than one and a spare is to be had: one is
  // written to the store while the next lands in the other, its receive posted
  // ahead (recv_segmented), so the client need not wait for the write to send it.
  SegmentPool::Segment segs[2];
  std::optional<ChunkStore::PendingPut> pending;
  if (auto s = segments_->acquire(); s.ok()) segs[0] = std::move(s).value();
  else st = s.status();
  if (st.ok() && segment_count(req.total) > 1) segs[1] = segments_->acquire_spare();
  const uint64_t nsegs = segs[1].valid() ? 2 : 1;
  if (st.ok()) {
    if (auto p = store_->begin_put(key, req.total, req.version, req.parts); p.ok())
      pending.emplace(std::move(p).value());
    else st = p.status();
  }
  KVS_RETURN_IF_ERROR(recv_segmented(
      c, true, req.id, req.total, segment_bytes(req.total, 0),
      [&](uint64_t i, uint64_t len) { return st.ok() ? segs[i % nsegs].span(len) : std::span<std::byte>(); },
      [&](std::span<std::byte> got) {
        if (st.ok()) st = pending->append(got);
      },
      cfg_.idle_timeout, cancel, nsegs - 1));
  bytes_in_ += req.total;
  if (st.ok()) st = store_->commit(std::move(*pending), req.checksum);
  if (st.ok()) {
    std::lock_guard lock(writes_mu_);
    if (write_watch_) write_watch_->on_write(key);
  }
  return {};
}

}  // namespace kvstream::storage
