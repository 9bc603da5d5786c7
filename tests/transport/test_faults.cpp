// Fault injection on the storage path: bytes flipped on the wire at every kind of
// offset (response headers, bodies, the handshake) are caught, never delivered as a
// chunk; a node that stalls behind a live connection is detected by the deadline.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <random>

#include "kvstream/storage.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::test_faults {

using namespace kvstream::storage;
using namespace kvstream::transport;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kSecret = "faults-secret-0123456789";

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerConfig sc;
    sc.address = "127.0.0.1:0";
    sc.directory = dir_.string();
    sc.secrets = {{"ns", kSecret}};
    server_ = std::move(Server::start(sc)).value();
    proxy_ = std::make_unique<test_util::TcpProxy>(server_->address());
    auto direct = connect_to(server_->address());
    ASSERT_TRUE(direct.ok()) << direct.status().to_string();
    std::mt19937 rng(5);
    chunk_.resize(300000);
    for (auto& b : chunk_) b = std::byte(rng());
    ASSERT_TRUE((*direct)->put("ctx", 0, 0, chunk_, deadline_in(10s)).ok());
  }
  void TearDown() override {
    proxy_.reset();
    server_.reset();
  }
  Result<std::unique_ptr<Client>> connect_to(const std::string& address, Deadline deadline = deadline_in(5s)) {
    ClientConfig cc;
    cc.address = address;
    cc.name_space = "ns";
    cc.secret = kSecret;
    return Client::connect(cc, deadline);
  }

  kvstream::testing::TempDir dir_{"kvstream-faults"};
  std::unique_ptr<Server> server_;
  std::unique_ptr<test_util::TcpProxy> proxy_;
  std::vector<std::byte> chunk_;
};

TEST_F(Faults, FlippedBytesOnTheWireAreNeverDelivered) {
  std::vector<std::byte> dest(chunk_.size());
  // Offsets across the handshake, the response header and the whole body.
  std::vector<int64_t> offsets = {0, 3, 17, 40, 64, 100, 150, 200, 300};
  std::mt19937 rng(11);
  for (int i = 0; i < 24; ++i) offsets.push_back(int64_t(rng() % (chunk_.size() + 400)));
  int detected = 0, connect_refused = 0, clean = 0;
  for (int64_t off : offsets) {
    proxy_->flip_at(off);
    auto c = connect_to(proxy_->address());
    if (!c.ok()) {  // the flip hit the handshake: refused, nothing exists for us
      ++connect_refused;
      continue;
    }
    auto mr = (*c)->register_memory(dest.data(), dest.size());
    ASSERT_TRUE(mr.ok());
    std::fill(dest.begin(), dest.end(), std::byte{0});
    auto got = (*c)->get("ctx", 0, 0, *mr, 0, dest.size(), deadline_in(3s));
    if (!got.ok()) {
      ++detected;
      continue;
    }
    // Delivered: then it must be the stored chunk, bit for bit (the flip fell in
    // bytes nobody reads, e.g. after the response).
    ASSERT_EQ(*got, chunk_.size()) << "offset " << off;
    ASSERT_EQ(0, std::memcmp(dest.data(), chunk_.data(), chunk_.size())) << "wrong chunk delivered, offset " << off;
    ++clean;
  }
  // Most flips land in the body: those must all have been caught.
  EXPECT_GE(detected + connect_refused, int(offsets.size()) - 2) << detected << " detected, " << connect_refused
                                                                  << " refused at connect, " << clean << " clean";
}

TEST_F(Faults, AStalledNodeIsDetectedByTheDeadline) {
  auto c = connect_to(proxy_->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<std::byte> dest(chunk_.size());
  auto mr = (*c)->register_memory(dest.data(), dest.size());
  ASSERT_TRUE(mr.ok());
  ASSERT_TRUE((*c)->get("ctx", 0, 0, *mr, 0, dest.size(), deadline_in(3s)).ok());
  proxy_->pause(true);
  // The node never answers: the deadline, and only it, ends the get, not before it.
  // (How soon after it is the machine's, not asserted: under the sanitizers on two
  // loaded cores "deadline + 100 ms" was a bound on the scheduler, not on the client.)
  const Deadline deadline = deadline_in(300ms);
  auto got = (*c)->get("ctx", 0, 0, *mr, 0, dest.size(), deadline);
  EXPECT_EQ(got.status().code(), StatusCode::timed_out) << got.status().to_string();
  EXPECT_GE(Clock::now(), deadline);
  auto st = (*c)->stat("ctx", deadline_in(200ms));
  EXPECT_FALSE(st.ok());
  proxy_->pause(false);
}

// The connection is lost under gets in flight (a node closing an idle connection as a
// request goes out, a restart, a middlebox's reset): each get is sent again on a fresh
// connection and completes whole. The proxy holds the requests (paused) so that none
// can have been answered before the cut. Without the resend every one fails.
TEST_F(Faults, GetsInFlightOnALostConnectionAreSentAgain) {
  auto c = connect_to(proxy_->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  constexpr int kGets = 8;
  std::vector<std::vector<std::byte>> dest(kGets, std::vector<std::byte>(chunk_.size()));
  std::vector<MemoryRegion> regions;
  for (auto& d : dest) {
    auto mr = (*c)->register_memory(d.data(), d.size());
    ASSERT_TRUE(mr.ok()) << mr.status().to_string();
    regions.push_back(*mr);
  }
  proxy_->pause(true);
  std::vector<std::promise<Result<size_t>>> done(kGets);
  for (int i = 0; i < kGets; ++i)
    (*c)->get_async("ctx", 0, 0, regions[size_t(i)], 0, chunk_.size(), deadline_in(20s), {},
                    [&, i](Result<size_t> r) { done[size_t(i)].set_value(std::move(r)); });
  proxy_->cut();
  proxy_->pause(false);
  for (int i = 0; i < kGets; ++i) {
    auto r = done[size_t(i)].get_future().get();
    ASSERT_TRUE(r.ok()) << "get " << i << ": " << r.status().to_string();
    EXPECT_EQ(*r, chunk_.size());
    EXPECT_EQ(dest[size_t(i)], chunk_) << "get " << i;
  }
}

// A node whose disk fills up mid-put: a clear no_space, no partial object
// visible (not in stat, not after a restart), and room for the next put that fits.
// Needs root for a 1 MiB tmpfs; skipped otherwise.
TEST(DiskFull, PutFailsCleanlyAndLeavesNothingBehind) {
  const fs::path mnt = fs::temp_directory_path() / fmt::format("kvstream-full-{}", ::getpid());
  fs::create_directories(mnt);
  if (std::system(fmt::format("mount -t tmpfs -o size=1m tmpfs '{}' 2>/dev/null", mnt.string()).c_str()) != 0) {
    fs::remove_all(mnt);
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): disk-full test skipped";
  }
  struct Unmount {
    fs::path m;
    ~Unmount() {
      (void)std::system(fmt::format("umount '{}'", m.string()).c_str());
      fs::remove_all(m);
    }
  } unmount{mnt};
  ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = (mnt / "store").string();
  sc.secrets = {{"ns", kSecret}};
  auto start = [&] { return std::move(Server::start(sc)).value(); };
  auto server = start();
  ClientConfig cc;
  cc.address = server->address();
  cc.name_space = "ns";
  cc.secret = kSecret;
  auto c = Client::connect(cc, deadline_in(5s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<std::byte> small(200000, std::byte{1}), big(size_t(2) << 20, std::byte{2});
  ASSERT_TRUE((*c)->put("ctx", 0, 0, small, deadline_in(5s)).ok());
  const Status full = (*c)->put("ctx", 1, 0, big, deadline_in(5s));
  EXPECT_EQ(full.code(), StatusCode::no_space) << full.to_string();
  auto st = (*c)->stat("ctx", deadline_in(5s));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  for (const auto& cs : *st) EXPECT_NE(cs.chunk, 1u) << "a partial object is visible";
  ASSERT_TRUE((*c)->put("ctx", 2, 0, small, deadline_in(5s)).ok());  // the failed put's space came back
  c->reset();
  server.reset();
  // After a restart: the two good chunks, nothing of the failed one.
  server = start();
  cc.address = server->address();
  c = Client::connect(cc, deadline_in(5s));
  ASSERT_TRUE(c.ok());
  st = (*c)->stat("ctx", deadline_in(5s));
  ASSERT_TRUE(st.ok());
  std::vector<uint32_t> chunks;
  for (const auto& cs : *st) chunks.push_back(cs.chunk);
  std::sort(chunks.begin(), chunks.end());
  EXPECT_EQ(chunks, (std::vector<uint32_t>{0, 2}));
  size_t tmp_files = 0;
  for (const auto& e : fs::recursive_directory_iterator(mnt / "store"))
    tmp_files += e.path().extension() == ".tmp";
  EXPECT_EQ(tmp_files, 0u);
}

}  // namespace

}  // namespace kvstream::test_faults
