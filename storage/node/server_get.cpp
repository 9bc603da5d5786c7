// A storage node's answer to a get (server_impl.hpp): the object or a range of it,
// from the cache or streamed from its file, with a checksum over exactly the bytes
// sent; damage found on the way moves the object aside.
#include <algorithm>
#include <array>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "storage/node/server_impl.hpp"

namespace kvstream::storage {

using transport::CancelToken;
using transport::Connection;
using transport::deadline_in;

Status ServerImpl::send_get(Connection& c, const ObjectKey& key, const Request& req, Response& r,
                            const CancelToken& cancel) {
  const auto deadline = deadline_in(cfg_.idle_timeout);
  // An answer without a body (the request's framing is intact: the connection stays).
  auto refuse = [&](const Status& s) {
    ++errors_;
    r.code = s.code(), r.message = s.message();
    r.checksum = 0, r.total = 0;
    return reply(c, r, deadline, cancel);
  };
  auto found = store_->get(key);
  if (!found.ok()) return refuse(found.status());
  cache_hits_ += found->cache_hit;
  uint64_t begin = 0, length = found->size;  // the whole object unless a range is asked for
  if (req.range_length != 0) {
    if (req.range_offset > found->size || req.range_length > found->size - req.range_offset)
      return refuse(make_status(StatusCode::out_of_range, "range [{}, {}) ends past the end of object {} ({} bytes)",
                                req.range_offset, req.range_offset + req.range_length, key.name(), found->size));
    begin = req.range_offset, length = req.range_length;
  }
  const bool whole = begin == 0 && length == found->size;
  r.total = length;
  if (found->bytes) {
    // Verified when it was read from disk; a range's sum is taken here.
    const Blob& blob = *found->bytes;
    const auto& data = blob.data;
    const auto body = std::span<const std::byte>(data).subspan(begin, length);
    r.checksum = whole ? found->checksum : body_checksum(body);
    if (!data.empty()) {
      std::lock_guard lock(blob.region_mu);
      if (!blob.region.valid()) {
        KVS_ASSIGN_OR_RETURN(blob.region, backend_->register_memory(const_cast<std::byte*>(data.data()), data.size(),
                                                                    transport::MemoryType::host));
      }
    }
    KVS_RETURN_IF_ERROR(send_segmented(
        c, encode(r), body, [&](uint32_t) { return data_response_header(r.id); }, deadline, cancel));
    bytes_out_ += length;
    return {};
  }
  std::array<SegmentPool::Segment, 2> bufs;
  for (auto& b : bufs)
    if (auto s = segments_->acquire(); s.ok()) b = std::move(s).value();
  if (!bufs[0].valid())
    return refuse(make_status(StatusCode::resource_exhausted, "the node's memory budget is full"));
  if (whole) {
    // The stored sum: a damaged payload fails the client's check (and is moved aside below).
    r.checksum = found->checksum;
  } else {
    // Part of an object too large to read whole: the whole object is verified first,
    // the range hashed as it passes, so the reply never vouches for damaged bytes.
    // (The range is read again to be sent; the file is immutable, and should the
    // disk return other bytes the second time the client's check fails.) A sealed
    // object's blocks authenticate themselves as they are opened, so only the range
    // is read: its sum is taken over the blocks it covers.
    const bool sealed = found->file.sealed();
    const uint64_t scan_from = sealed ? begin : 0, scan_to = sealed ? begin + length : found->size;
    XXH3_state_t all, range;
    XXH3_64bits_reset(&all), XXH3_64bits_reset(&range);
    for (uint64_t at = scan_from; at < scan_to; at += kSegmentBytes) {
      const uint64_t len = std::min<uint64_t>(kSegmentBytes, scan_to - at);
      const auto span = bufs[0].span(len);
      if (Status s = found->file.read(at, span); !s.ok()) {
        if (s.code() == StatusCode::corrupt_data) store_->report_corrupt(key, found->file);
        return refuse(s);
      }
      if (!sealed) XXH3_64bits_update(&all, span.data(), span.size());
      const uint64_t from = std::max(at, begin), to = std::min(at + len, begin + length);
      if (from < to) XXH3_64bits_update(&range, span.data() + (from - at), size_t(to - from));
    }
    if (!sealed && XXH3_64bits_digest(&all) != found->checksum) {
      store_->report_corrupt(key, found->file);
      return refuse(make_status(StatusCode::corrupt_data, "object {} failed its checksum on disk", key.name()));
    }
    r.checksum = XXH3_64bits_digest(&range);
  }
  const size_t nbufs = bufs[1].valid() ? 2 : 1;
  const uint64_t n = segment_count(length);
  std::vector<uint64_t> seqs(n);
  // A clear object is hashed as it streams, to find damage the client will report. A
  // sealed one needs no second check: every block it sends passed its tag.
  const bool hashed = !found->file.sealed();
  XXH3_state_t hash;
  XXH3_64bits_reset(&hash);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t len = segment_bytes(length, i);
    if (i >= nbufs) KVS_RETURN_IF_ERROR(c.wait_sends(seqs[i - nbufs], deadline, cancel));  // its buffer is free
    const auto span = bufs[i % nbufs].span(len);
    // A read error after the header has promised the body cannot be put in a reply:
    // the connection ends and the client sees its request fail. A sealed block that
    // fails its tag is never sent; the object is moved aside.
    if (Status s = found->file.read(begin + i * kSegmentBytes, span); !s.ok()) {
      if (s.code() == StatusCode::corrupt_data) store_->report_corrupt(key, found->file);
      return s;
    }
    if (hashed) XXH3_64bits_update(&hash, span.data(), span.size());
    KVS_ASSIGN_OR_RETURN(seqs[i], c.post_send(i == 0 ? encode(r) : data_response_header(r.id), span));
  }
  KVS_RETURN_IF_ERROR(c.wait_sends(seqs[n - 1], deadline, cancel));
  bytes_out_ += length;
  // The client checks the same sum and reports corrupt_data; the node moves the
  // damaged object aside.
  if (hashed && XXH3_64bits_digest(&hash) != r.checksum) store_->report_corrupt(key, found->file);
  return {};
}

}  // namespace kvstream::storage
