// A rate-limited link in front of a storage client: a decorator that makes a
// storage::Client behave as if its node sat behind a link of a given bandwidth (a
// token bucket), whatever the real transport underneath (loopback included). The
// demo and benchmarks use it to show the level chooser at work on a slow link
// without root or traffic shaping (tc/netem).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

/// The link rate used when none is given: 3 Gbit/s, the bandwidth CacheGen's
/// evaluation assumes between storage and GPU hosts.
inline constexpr double kDefaultPacedBitsPerSecond = 3e9;

/// Settings of a paced client (defaults documented per field).
struct PacedClientConfig {
  /// Link rate in bits per second (> 0, finite). Default 3 Gbit/s.
  double bits_per_second = kDefaultPacedBitsPerSecond;
  /// Token-bucket depth: bytes that may pass at once after the link was idle long
  /// enough to fill the bucket. 0 (default): none, the link is a pure rate.
  uint64_t burst_bytes = 0;
  /// Also pace put() (the upload direction, with its own bucket at the same rate).
  /// Default false: only the download of chunk bodies is paced.
  bool pace_puts = false;
  /// The clock the link's time is kept on and deadlines are compared with. Empty
  /// (default): transport::Clock::now, the steady clock. Tests pass a clock they move,
  /// to check the paced times without waiting for them; held completions are then
  /// looked at again at least every millisecond of real time.
  std::function<transport::Clock::time_point()> now;
};

/// Wraps `inner` so that chunk bodies fetched through it flow at most at
/// `config.bits_per_second`. Semantics of get_async (and get / get_future):
///  * the request goes to `inner` at once (several may be in flight, as before);
///  * when `inner` completes with n bytes, the link's bucket is charged n bytes in
///    completion order; the transfer is taken to start when it was requested or
///    when the link finished the previous body, whichever is later, and ends
///    n x 8 / bits_per_second later (minus what the bucket had saved up);
///  * the completion is released no earlier than that paced end (nor earlier than
///    the real one): it runs on the decorator's timer thread;
///  * a request whose deadline passes, or whose cancel token fires, while its
///    completion is held completes then with timed_out / cancelled (on the paced
///    link its bytes had not arrived yet); its bytes were still charged;
///  * errors from `inner` are passed on at once and charge nothing.
/// get_range_async (and get_range) is paced the same way, charging the range's
/// `length` bytes: what a range read puts on the link.
/// put(), put_versioned() and put_parts() are paced the same way (after the inner put
/// returns, the call sleeps until the paced end) only when config.pace_puts, charging
/// the object's bytes (a parts table rides in the request header, as control data);
/// stat (parts tables included), list, remove and register_memory pass straight
/// through (control messages are not paced).
/// Destroying the decorator destroys `inner` first (its pending requests complete
/// with its own errors) and then releases every held completion at once.
/// Errors: invalid_argument (null inner, rate not > 0 or not finite).
Result<std::unique_ptr<Client>> make_paced_client(std::unique_ptr<Client> inner, const PacedClientConfig& config);

/// make_paced_client(inner, {bits_per_second}) with no burst; a bad rate or a null
/// inner yields nullptr.
std::unique_ptr<Client> make_paced_client(std::unique_ptr<Client> inner,
                                          double bits_per_second = kDefaultPacedBitsPerSecond);

}  // namespace kvstream::storage
