// Requests of the storage node's client that find no live connection wait here while
// one thread of the client connects again; no caller's thread connects. An
// asynchronous get returns at once (a runtime's scheduler loop is not held for the
// reconnection's second), a lost connection's receiver hands its resends here and
// returns, and each waiting request still ends at its own deadline or cancel.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "storage/client_channel.hpp"

namespace kvstream::storage::client_detail {

class Redial {
 public:
  /// Makes the lost connections again, within `deadline` (and a bound of its own);
  /// ok, or why not.
  using Reconnect = std::function<Status(transport::Deadline, const transport::CancelToken&)>;
  /// Sends a request on a live connection (or back here when there is none).
  using Dispatch = std::function<void(Request, std::span<const std::byte>, Pending)>;

  Redial(Reconnect reconnect, Dispatch dispatch);
  ~Redial();
  Redial(const Redial&) = delete;
  Redial& operator=(const Redial&) = delete;

  /// Holds the request (its body is the caller's, who waits for `p.done`) until a
  /// connection is made again (then dispatched), its deadline passes or it is
  /// cancelled, or the reconnection fails (its error). Starts the thread that
  /// reconnects on first use.
  void wait(Request req, std::span<const std::byte> body, Pending p);

  /// Fails what waits, and every later request, with `cancelled`; stops a
  /// reconnection in flight and joins the threads. The client calls it before its
  /// connections go.
  void close();

 private:
  struct Waiting {
    Request req;
    std::span<const std::byte> body;
    Pending p;
  };
  Reconnect reconnect_;
  Dispatch dispatch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;
  bool closed_ = false;
  // One reconnection at a time, on a thread of its own so that the loop keeps
  // ending requests at their deadlines while it runs.
  bool attempting_ = false, attempt_done_ = false;
  Status attempt_result_;
  std::thread loop_, attempt_;
  transport::CancelToken stop_;

  void run();
  std::vector<std::pair<Done, Status>> take_due_locked();
};

}  // namespace kvstream::storage::client_detail
