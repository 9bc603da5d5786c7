// A body too large for one message (a put's, a get's answer) as segments of
// kSegmentBytes: all posted at once by the sender, received in order by the
// receiver with the receives of later segments posted ahead (protocol.hpp).
#include "storage/protocol.hpp"

#include <deque>
#include <utility>

namespace kvstream::storage {

Status send_segmented(transport::Connection& c, std::span<const std::byte> first_header,
                      std::span<const std::byte> body,
                      const std::function<std::vector<std::byte>(uint32_t)>& data_header,
                      transport::Deadline deadline, const transport::CancelToken& cancel) {
  const uint64_t n = segment_count(body.size());
  KVS_ASSIGN_OR_RETURN(uint64_t seq, c.post_send(first_header, body.first(segment_bytes(body.size(), 0))));
  for (uint64_t i = 1; i < n; ++i) {
    KVS_ASSIGN_OR_RETURN(seq, c.post_send(data_header(uint32_t(i)),
                                          body.subspan(i * kSegmentBytes, segment_bytes(body.size(), i))));
  }
  return c.wait_sends(seq, deadline, cancel);
}

namespace {

// The receive side of a segmented body, with the receives of segments that come after
// the one landing posted ahead of their headers.
class SegmentReceiver {
 public:
  SegmentReceiver(transport::Connection& c, uint64_t total,
                  const std::function<std::span<std::byte>(uint64_t, uint64_t)>& dest)
      : c_(c), total_(total), n_(segment_count(total)), dest_(dest) {}

  // Posts the receives of segments up to (not including) `end`; the first segment's
  // header has been read, so it is never posted for.
  Status post_until(uint64_t end) {
    for (end = std::min(end, n_); next_post_ < end; ++next_post_) {
      auto span = dest_(next_post_, segment_bytes(total_, next_post_));
      KVS_RETURN_IF_ERROR(c_.post_recv(span));
      posted_.emplace_back(next_post_, span);
    }
    return {};
  }

  // Where segment `i` (the next to land) goes: its post's memory, or, not posted,
  // dest's.
  std::span<std::byte> place(uint64_t i, uint64_t len) {
    return posted_.empty() || posted_.front().first != i ? dest_(i, len) : posted_.front().second;
  }

  // Segment `i` has landed: its post, if it had one, is over.
  void landed(uint64_t i) {
    if (!posted_.empty() && posted_.front().first == i) posted_.pop_front();
  }

  // An error ends the exchange: posts that did not land are withdrawn first (the
  // segment being received too: a post stays through a receive that timed out). A
  // failure to withdraw is the worse error, as their memory may still be written.
  Status fail(Status st) {
    if (posted_.empty()) return st;
    posted_.clear();
    if (Status w = c_.abandon_posts(); !w.ok()) return w;
    return st;
  }

  [[nodiscard]] uint64_t count() const { return n_; }

 private:
  transport::Connection& c_;
  const uint64_t total_, n_;
  const std::function<std::span<std::byte>(uint64_t, uint64_t)>& dest_;
  uint64_t next_post_ = 1;
  std::deque<std::pair<uint64_t, std::span<std::byte>>> posted_;  // segment, its memory
};

}  // namespace

Status recv_segmented(transport::Connection& c, bool of_request, uint64_t id, uint64_t total, size_t first_len,
                      const std::function<std::span<std::byte>(uint64_t i, uint64_t len)>& dest,
                      const std::function<void(std::span<std::byte>)>& landed,
                      std::chrono::milliseconds per_segment, const transport::CancelToken& cancel,
                      uint64_t ahead) {
  if (first_len != segment_bytes(total, 0))
    return make_status(StatusCode::corrupt_data, "message {}: first segment of {} bytes for a body of {}", id,
                       first_len, total);
  SegmentReceiver rx(c, total, dest);
  std::vector<std::byte> header;
  for (uint64_t i = 0, n = rx.count(); i < n; ++i) {
    const uint64_t len = segment_bytes(total, i);
    const auto deadline = transport::deadline_in(per_segment);
    // Segment i - 1 has landed: its memory (or an earlier one's) may take the next post.
    if (Status st = rx.post_until(ahead >= n ? n : i + 1 + ahead); !st.ok()) return rx.fail(st);
    if (i > 0) {
      auto got = c.recv_header(header, deadline, cancel);
      if (!got.ok()) return rx.fail(got.status());
      bool ok = *got == len;
      if (of_request) {
        auto d = decode_request(header);
        ok = ok && d.ok() && d->op == Op::data && d->id == id && d->chunk == i;
      } else {
        auto d = decode_response(header);
        ok = ok && d.ok() && d->op == Op::data && d->id == id;
      }
      if (!ok) return rx.fail(make_status(StatusCode::corrupt_data, "segment {} of message {} is malformed", i, id));
    }
    const auto span = rx.place(i, len);
    if (Status st = c.recv_body(span, deadline, cancel); !st.ok()) return rx.fail(st);
    rx.landed(i);
    landed(span);
  }
  return {};
}

}  // namespace kvstream::storage
