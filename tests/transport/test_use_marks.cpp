// Use marks and usage listings (Client::touch, Client::usage): what a node keeps of a
// context's use, how it lists its contexts for an evictor, what survives a restart,
// the wire forms and their bounds, and a client of a node from before them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kvstream/storage.hpp"
#include "storage/node/chunk_store.hpp"
#include "storage/protocol.hpp"
#include "tests/support/raw_peer.hpp"
#include "tests/transport/node_test_util.hpp"
#include "tests/transport/transport_test_util.hpp"

namespace kvstream::storage {
namespace {

using namespace std::chrono_literals;
using node_test_util::connect_client;
using node_test_util::node_config;
using node_test_util::TempDir;
using transport::deadline_in;
using transport::test_util::pattern;
namespace fs = std::filesystem;

const std::string kSecret = "use-marks-secret-0123";

std::vector<ContextTouch> touches(std::initializer_list<std::pair<const char*, uint32_t>> l) {
  std::vector<ContextTouch> out;
  for (const auto& [c, d] : l) out.push_back({c, d});
  return out;
}

const ContextUsage* find(const std::vector<ContextUsage>& v, const std::string& name) {
  for (const auto& u : v)
    if (u.context == name) return &u;
  return nullptr;
}

TEST(UseMarks, ATouchRaisesMarksAndTheListingShowsThem) {
  TempDir dir("kvstream-use");
  auto server = Server::start(node_config(dir.path(), {{"t", kSecret}}));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto c = connect_client((*server)->address(), "t", kSecret);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Client& cl = **c;
  const auto d = [] { return deadline_in(10s); };
  ASSERT_TRUE(cl.put_versioned("m.a", 0, 0, pattern(100, 1), 50, d()).ok());
  ASSERT_TRUE(cl.put_versioned("m.a", 0, 2, pattern(30, 2), 70, d()).ok());
  ASSERT_TRUE(cl.put_versioned("m.a", 1, 0, pattern(40, 3), 60, d()).ok());
  ASSERT_TRUE(cl.put_versioned("m.b", 0, 0, pattern(10, 4), 80, d()).ok());
  ASSERT_TRUE(cl.put_versioned("x.c", 3, 1, pattern(5, 5), 90, d()).ok());

  auto all = cl.usage("", d());
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0], (ContextUsage{"m.a", 170, {0, 1}, 70, 0, 0}));
  EXPECT_EQ((*all)[1], (ContextUsage{"m.b", 10, {0}, 80, 0, 0}));
  EXPECT_EQ((*all)[2], (ContextUsage{"x.c", 5, {3}, 90, 0, 0}));

  // A stored context takes the stamp and its depth; one not stored is passed over.
  ASSERT_TRUE(cl.touch(touches({{"m.a", 0}, {"m.b", 1}, {"m.none", 2}}), 1000, d()).ok());
  auto m = cl.usage("m.", d());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].used, 1000u);
  EXPECT_EQ((*m)[0].depth, 0u);
  EXPECT_EQ((*m)[1].used, 1000u);
  EXPECT_EQ((*m)[1].depth, 1u);
  // An older stamp lowers nothing; the same stamp takes the depth given now; a newer
  // one replaces both.
  ASSERT_TRUE(cl.touch(touches({{"m.a", 5}}), 999, d()).ok());
  ASSERT_TRUE(cl.touch(touches({{"m.b", 4}}), 1000, d()).ok());
  ASSERT_TRUE(cl.touch(touches({{"x.c", 7}}), 2000, d()).ok());
  all = cl.usage("", d());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(find(*all, "m.a")->used, 1000u);
  EXPECT_EQ(find(*all, "m.a")->depth, 0u);
  EXPECT_EQ(find(*all, "m.b")->depth, 4u);
  EXPECT_EQ(find(*all, "x.c")->used, 2000u);
  EXPECT_EQ(find(*all, "x.c")->depth, 7u);
  EXPECT_EQ(find(*all, "m.none"), nullptr) << "a touch made a context";
  // Stamp 0: this process's clock, after every version it gave before.
  ASSERT_TRUE(cl.touch(touches({{"m.a", 0}}), 0, d()).ok());
  all = cl.usage("m.a", d());
  ASSERT_TRUE(all.ok());
  EXPECT_GT((*all)[0].used, 2000u);
  // A prefix nothing starts with lists nothing; namespaces see only their own.
  EXPECT_TRUE(cl.usage("zz", d())->empty());
  // Bad ids are refused before anything is sent.
  EXPECT_EQ(cl.touch(touches({{"../x", 0}}), 1, d()).code(), StatusCode::invalid_argument);
  EXPECT_EQ(cl.usage("a/b", d()).status().code(), StatusCode::invalid_argument);
}

TEST(UseMarks, MarksOutliveARestartButNotARemoveAndATornOneReadsAsNone) {
  TempDir dir("kvstream-use");
  const auto d = [] { return deadline_in(10s); };
  {
    auto server = Server::start(node_config(dir.path(), {{"t", kSecret}}));
    ASSERT_TRUE(server.ok());
    auto c = connect_client((*server)->address(), "t", kSecret);
    ASSERT_TRUE(c.ok());
    for (const char* ctx : {"a", "b", "gone"}) ASSERT_TRUE((*c)->put(ctx, 0, 0, pattern(64, 1), d()).ok());
    ASSERT_TRUE((*c)->touch(touches({{"a", 3}, {"b", 4}, {"gone", 5}}), 4242, d()).ok());
    ASSERT_TRUE((*c)->remove("gone", d()).ok());
    ASSERT_TRUE((*c)->put("gone", 0, 0, pattern(64, 1), d()).ok());
  }
  // b's mark torn by a crash: its checksum fails.
  {
    std::fstream f(dir.path() / "t" / "b" / "use", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(9);
    f.put('\x7f');
  }
  auto server = Server::start(node_config(dir.path(), {{"t", kSecret}}));
  ASSERT_TRUE(server.ok());
  auto c = connect_client((*server)->address(), "t", kSecret);
  ASSERT_TRUE(c.ok());
  auto all = (*c)->usage("", d());
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ(find(*all, "a")->used, 4242u);
  EXPECT_EQ(find(*all, "a")->depth, 3u);
  EXPECT_EQ(find(*all, "b")->used, 0u) << "a torn mark was read";
  EXPECT_EQ(find(*all, "gone")->used, 0u) << "a mark outlived its context's remove";
}

// The listing pages by name: each page starts after the name the last one ended with.
TEST(UseMarks, ListingPagesFollowTheNames) {
  TempDir dir("kvstream-use");
  MemoryBudget budget(64 << 20);
  auto store = ChunkStore::open(dir.path().string(), 1 << 20, budget);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  std::vector<std::string> names;
  for (int i = 0; i < 7; ++i) names.push_back(fmt::format("p.{}", i));
  for (const auto& n : names) ASSERT_TRUE((*store)->put({"t", n, 0, 0}, pattern(8, 1)).ok());
  ASSERT_TRUE((*store)->put({"t", "q.0", 0, 0}, pattern(8, 1)).ok());
  ASSERT_TRUE((*store)->put({"t", "o.0", 0, 0}, pattern(8, 1)).ok());
  std::vector<std::string> seen;
  std::string after;
  for (;;) {
    auto page = (*store)->usage("t", "p.", after, 3);
    for (const auto& u : page) seen.push_back(u.context);
    if (page.size() < 3) break;
    after = page.back().context;
  }
  EXPECT_EQ(seen, names);
  // A start before the prefix starts at the prefix.
  EXPECT_EQ((*store)->usage("t", "p.", "a", 1)[0].context, "p.0");
  // A byte bound ends a page early, never before its first entry.
  EXPECT_EQ((*store)->usage("t", "p.", "", 100, 1).size(), 1u);
  EXPECT_EQ((*store)->usage("t", "p.", "", 100, 4 + 2 * 40).size(), 2u);  // an entry of "p.N", one chunk: 40 bytes
  EXPECT_TRUE((*store)->usage("other", "", "", 10).empty());
}

TEST(UseMarks, WireFormsRoundTripAndMalformedOnesAreRefused) {
  Request t;
  t.op = Op::touch, t.id = 9, t.total = 100, t.checksum = 77, t.version = 123456;
  auto back = decode_request(encode(t));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->total, 100u);
  EXPECT_EQ(back->checksum, 77u);
  EXPECT_EQ(back->version, 123456u);
  t.total = 0;
  EXPECT_FALSE(decode_request(encode(t)).ok()) << "a touch of no body";
  t.total = kMaxTouchBodyBytes + 1;
  EXPECT_FALSE(decode_request(encode(t)).ok()) << "a touch past one segment";

  Request u;
  u.op = Op::usage, u.context = "model.", u.after = "model.3", u.chunk = 10;
  back = decode_request(encode(u));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->context, "model.");
  EXPECT_EQ(back->after, "model.3");
  EXPECT_EQ(back->chunk, 10u);
  u.context = "";
  EXPECT_TRUE(decode_request(encode(u)).ok()) << "an empty prefix lists everything";
  u.chunk = 0;
  EXPECT_FALSE(decode_request(encode(u)).ok()) << "a page of no entries";
  u.chunk = 5, u.after = "../x";
  EXPECT_FALSE(decode_request(encode(u)).ok());

  Response hello;
  hello.op = Op::hello, hello.features = kFeatureUsage;
  auto h = decode_response(encode(hello));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->features, kFeatureUsage);
  EXPECT_EQ(h->checksum, 0u);

  const auto list = touches({{"a", 1}, {"bb", 2}});
  auto tb = encode_touches(list);
  EXPECT_EQ(*decode_touches(tb), list);
  for (size_t cut = 0; cut < tb.size(); ++cut) EXPECT_FALSE(decode_touches(std::span(tb).first(cut)).ok()) << cut;
  EXPECT_FALSE(decode_touches(encode_touches({})).ok()) << "a touch of nothing";
  auto bad = encode_touches(touches({{".x", 1}}));
  EXPECT_EQ(decode_touches(bad).status().code(), StatusCode::invalid_argument);

  const std::vector<ContextUsage> usage = {{"a", 5, {0, 1}, 9, 10, 2}, {"b", 0, {}, 0, 0, 0}};
  auto ub = encode_usage(usage);
  EXPECT_EQ(*decode_usage(ub), usage);
  for (size_t cut = 0; cut < ub.size(); ++cut) EXPECT_FALSE(decode_usage(std::span(ub).first(cut)).ok()) << cut;
  EXPECT_FALSE(decode_usage(encode_usage({usage[1], usage[0]})).ok()) << "names out of order";
  EXPECT_FALSE(decode_usage(encode_usage({{"a", 5, {1, 0}, 9, 10, 2}})).ok()) << "chunks out of order";
  EXPECT_FALSE(decode_usage(encode_usage({{"a", 5, {1, 1}, 9, 10, 2}})).ok()) << "a chunk twice";
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> g(rng() % 80);
    for (auto& b : g) b = std::byte(rng());
    (void)decode_touches(g);
    (void)decode_usage(g);
  }
}

// A touch whose body does not parse is answered with the reason and the connection
// goes on serving (its framing was intact).
TEST(UseMarks, AMalformedTouchIsRefusedAndTheConnectionStays) {
  TempDir dir("kvstream-use");
  auto server = Server::start(node_config(dir.path(), {{"t", kSecret}}));
  ASSERT_TRUE(server.ok());
  kvstream::testing::RawPeer peer;
  ASSERT_TRUE(peer.connect((*server)->address()));
  ASSERT_TRUE(peer.authenticate("t", kSecret));
  std::vector<std::byte> body = encode_touches(touches({{"ok", 1}}));
  body[0] = std::byte{9};  // claims 9 entries
  Request t;
  t.op = Op::touch, t.id = 1, t.total = body.size(), t.checksum = body_checksum(body), t.version = 5;
  ASSERT_TRUE(peer.send_message(encode(t), body.size(), body));
  auto r = peer.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->id, 1u);
  EXPECT_EQ(r->code, StatusCode::corrupt_data);
  // A body that fails its declared checksum, then a listing: both answered.
  body = encode_touches(touches({{"ok", 1}}));
  t.id = 2, t.total = body.size(), t.checksum = body_checksum(body) + 1;
  ASSERT_TRUE(peer.send_message(encode(t), body.size(), body));
  r = peer.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, StatusCode::corrupt_data);
  Request u;
  u.op = Op::usage, u.id = 3, u.chunk = 10;
  ASSERT_TRUE(peer.send_message(encode(u), 0, {}));
  r = peer.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->id, 3u);
  EXPECT_EQ(r->code, StatusCode::ok);
}

// A node from before marks says hello without the feature: the client answers touch
// and usage `unsupported` without sending them (the old node would end the connection
// on an op it does not know), and its next request is the first the node sees: a
// stat that asks for no write versions (the old node would answer without them).
TEST(UseMarks, AClientOfANodeWithoutMarksSendsNoneOfThem) {
  transport::BackendConfig bc;
  bc.name = "tcp";
  auto backend = transport::create_backend(bc);
  ASSERT_TRUE(backend.ok());
  auto listener = (*backend)->listen("127.0.0.1:0");
  ASSERT_TRUE(listener.ok());
  std::optional<Request> first_request;
  std::thread node([&] {
    auto conn = (*listener)->accept(deadline_in(30s), {});
    if (!conn.ok()) return;
    Response hello;
    hello.op = Op::hello;  // features 0: a node from before them
    if (!(*conn)->send(encode(hello), {}, deadline_in(30s), {}).ok()) return;
    std::vector<std::byte> header;
    if (!(*conn)->recv_header(header, deadline_in(30s), {}).ok() || !(*conn)->recv_body({}, deadline_in(30s), {}).ok())
      return;
    auto auth = decode_request(header);
    Response ok;
    ok.op = Op::auth, ok.id = auth.ok() ? auth->id : 0;
    if (!(*conn)->send(encode(ok), {}, deadline_in(30s), {}).ok()) return;
    if (!(*conn)->recv_header(header, deadline_in(30s), {}).ok()) return;
    if (auto r = decode_request(header); r.ok()) first_request = *r;
    (void)(*conn)->recv_body({}, deadline_in(30s), {});
    Response none;
    none.op = Op::stat, none.id = first_request ? first_request->id : 0, none.code = StatusCode::not_found;
    (void)(*conn)->send(encode(none), {}, deadline_in(30s), {});
  });
  ClientConfig cc;
  cc.address = (*listener)->address(), cc.backend = bc, cc.name_space = "t", cc.secret = kSecret;
  auto c = Client::connect(cc, deadline_in(30s));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)->touch(touches({{"a", 0}}), 0, deadline_in(30s)).code(), StatusCode::unsupported);
  EXPECT_EQ((*c)->usage("", deadline_in(30s)).status().code(), StatusCode::unsupported);
  EXPECT_EQ((*c)->stat("a", deadline_in(30s)).status().code(), StatusCode::not_found);
  node.join();
  ASSERT_TRUE(first_request.has_value());
  EXPECT_EQ(first_request->op, Op::stat);
  EXPECT_EQ(first_request->flags, 0) << "a stat flag sent to a node that did not declare versions";
}

}  // namespace
}  // namespace kvstream::storage
