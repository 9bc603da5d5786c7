// A parallel loop over independent indices, for offline work such as the profile
// build: each index writes only its own outputs, so the result is the same for any
// number of workers, and the error returned is the one of the lowest failing index.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream {

/// Workers for `threads` (0: one per hardware thread), never more than `n`, at least 1.
inline unsigned worker_count(unsigned threads, size_t n) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return unsigned(std::max<size_t>(1, std::min<size_t>(threads, n)));
}

/// Calls fn(i) -> Status for every i in [0, n) on up to `threads` workers (0: one per
/// hardware thread), the calling thread among them. Every index runs, failing or not;
/// returns the status of the lowest index that failed. Where the system refuses a new
/// thread, the workers already started (and the caller) do the rest.
template <typename Fn>
Status parallel_for(size_t n, unsigned threads, Fn&& fn) {
  std::vector<Status> status(n);
  std::atomic<size_t> next{0};
  // An exception thrown on a worker thread would end the process: it becomes that
  // index's error instead, as it would have reached the caller of a serial loop.
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      try {
        status[i] = fn(i);
      } catch (const std::bad_alloc&) {
        status[i] = make_status(StatusCode::resource_exhausted, "out of memory in parallel work item {}", i);
      } catch (const std::exception& e) {
        status[i] = make_status(StatusCode::internal, "parallel work item {}: {}", i, e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned workers = worker_count(threads, n);
  for (unsigned t = 1; t < workers; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  for (Status& s : status)
    if (!s.ok()) return std::move(s);
  return {};
}

}  // namespace kvstream
