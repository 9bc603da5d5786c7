// MemberCatchUp: the reads of the member set a replicated client makes for gets that
// a node told the set moved (member_catch_up.hpp). Behaviour by ordering and counts:
// the reads are held by the test, never timed.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "storage/cluster/member_catch_up.hpp"

namespace kvstream::test_member_catch_up {

using namespace std::chrono_literals;
using cluster::MemberCatchUp;
using transport::CancelToken;
using transport::Deadline;

// A read the test lets finish, one at a time, with the status it is given.
struct HeldReads {
  std::mutex mu;
  std::condition_variable cv;
  int started = 0, released = 0;
  Status answer;
  Status read(const CancelToken& cancel) {
    std::unique_lock lock(mu);
    const int mine = ++started;
    cv.notify_all();
    while (released < mine && !cancel.cancelled()) cv.wait_for(lock, 5ms);
    return cancel.cancelled() ? Status(StatusCode::cancelled, "read cancelled") : answer;
  }
  void wait_started(int n) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return started >= n; });
  }
  void release(Status s = {}) {
    std::lock_guard lock(mu);
    answer = std::move(s);
    ++released;
    cv.notify_all();
  }
};

MemberCatchUp make(HeldReads& held) {
  return MemberCatchUp([&held](Deadline, const CancelToken& cancel) { return held.read(cancel); },
                       [] { return int64_t(10); }, 5s, 0ms);
}

// Each asker gets the outcome of a read that began after it asked: those that ask
// while a read runs wait for the next, and share it.
TEST(MemberCatchUp, GetsThatAskDuringAReadShareTheNextOne) {
  HeldReads held;
  std::promise<Status> first, second, third;
  {
    MemberCatchUp up = make(held);
    EXPECT_FALSE(up.request(10, [](const Status&) { ADD_FAILURE() << "ran"; }))
        << "a node told of a set no newer than the client's: nothing to read";
    ASSERT_TRUE(up.request(11, [&](const Status& s) { first.set_value(s); }));
    held.wait_started(1);
    ASSERT_TRUE(up.request(11, [&](const Status& s) { second.set_value(s); }));
    ASSERT_TRUE(up.request(11, [&](const Status& s) { third.set_value(s); }));
    held.release();  // the first read: it began before the others asked
    EXPECT_TRUE(first.get_future().get().ok());
    held.wait_started(2);
    auto later = second.get_future();
    EXPECT_EQ(later.wait_for(0s), std::future_status::timeout) << "served by a read that began before it asked";
    held.release(Status(StatusCode::unavailable, "etcd down"));
    EXPECT_EQ(later.get().code(), StatusCode::unavailable) << "the read's error reaches the get";
    EXPECT_EQ(third.get_future().get().code(), StatusCode::unavailable);
    EXPECT_EQ(up.reads(), 2u) << "two askers during a read: one read more, not two";
  }
  EXPECT_EQ(held.started, 2);
}

// Stopping ends the read in flight (its token) and answers the gets waiting with
// cancelled; a request after that is refused.
TEST(MemberCatchUp, StoppingCancelsTheReadAndAnswersTheWaiting) {
  HeldReads held;
  std::promise<Status> during, after;
  {
    MemberCatchUp up = make(held);
    ASSERT_TRUE(up.request(11, [&](const Status& s) { during.set_value(s); }));
    held.wait_started(1);
    ASSERT_TRUE(up.request(11, [&](const Status& s) { after.set_value(s); }));
    up.stop();  // the read never released: stop must not wait on it
    EXPECT_FALSE(up.request(11, [](const Status&) { ADD_FAILURE() << "ran"; })) << "refused once stopped";
  }
  EXPECT_EQ(during.get_future().get().code(), StatusCode::cancelled);
  EXPECT_EQ(after.get_future().get().code(), StatusCode::cancelled);
  EXPECT_EQ(held.started, 1) << "no read begins once stopping";
}

// A read that failed is told to calls that would otherwise wait for the next one, for
// as long as they ask within the given time; a read that succeeded clears it.
TEST(MemberCatchUp, AFailedReadIsToldUntilAReadSucceeds) {
  HeldReads held;
  MemberCatchUp up = make(held);
  EXPECT_TRUE(up.recent_failure(1h).ok()) << "no read yet";
  std::promise<Status> failed, passed;
  ASSERT_TRUE(up.request(11, [&](const Status& s) { failed.set_value(s); }));
  held.release(Status(StatusCode::unavailable, "etcd down"));
  ASSERT_EQ(failed.get_future().get().code(), StatusCode::unavailable);
  EXPECT_EQ(up.recent_failure(1h).code(), StatusCode::unavailable) << "noted before the askers heard";
  EXPECT_TRUE(up.recent_failure(0s).ok()) << "older than asked for";
  ASSERT_TRUE(up.request(11, [&](const Status& s) { passed.set_value(s); }));
  held.release();
  ASSERT_TRUE(passed.get_future().get().ok());
  EXPECT_TRUE(up.recent_failure(1h).ok()) << "a read succeeded since";
}

// Nudges (one per message that says a set is newer) share reads as requests do, and
// one naming a set no newer than an earlier nudge's adds nothing; after a failed read
// the next nudge asks again.
TEST(MemberCatchUp, NudgesForTheSameSetMakeOneRead) {
  HeldReads held;
  MemberCatchUp up = make(held);
  up.nudge(10);  // no newer than the client's set (10)
  for (int i = 0; i < 1000; ++i) up.nudge(12);
  held.wait_started(1);
  for (int i = 0; i < 1000; ++i) up.nudge(12);  // while the read runs: the same set
  held.release(Status(StatusCode::unavailable, "etcd down"));
  // A waiter after the failure marks when the thread has moved past it.
  std::promise<Status> after;
  ASSERT_TRUE(up.request(12, [&](const Status& s) { after.set_value(s); }));
  held.wait_started(2);
  held.release();
  ASSERT_TRUE(after.get_future().get().ok());
  EXPECT_EQ(up.reads(), 2u) << "2000 nudges for one set: one read (and the waiter's)";
  up.nudge(12);  // the first read failed: asked again
  held.wait_started(3);
  held.release();
  up.stop();
  EXPECT_EQ(up.reads(), 3u);
}

}  // namespace kvstream::test_member_catch_up
