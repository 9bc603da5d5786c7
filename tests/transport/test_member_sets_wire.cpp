// A request's member-set revision and the node's answer that its own set is newer, as
// they travel (storage/protocol.hpp: kMembersRevision, Response::members_newer) and
// as a replicated client's node clients share them (storage/members_link.hpp).
#include <gtest/gtest.h>

#include <vector>

#include "storage/members_link.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage {
namespace {

Request request(Op op) {
  Request r;
  r.op = op, r.id = 9, r.context = "ctx";
  if (op == Op::usage) r.context = "", r.chunk = 16;
  if (op == Op::list || op == Op::touch) r.context.clear();
  if (op == Op::put || op == Op::touch) r.total = 8, r.checksum = 1, r.version = 5;
  return r;
}

TEST(MemberSetsWire, EveryCallNamesItsSetBesideItsOwnFlag) {
  for (Op op : {Op::put, Op::get, Op::stat, Op::remove, Op::list, Op::touch, Op::usage}) {
    Request r = request(op);
    r.flags = kMembersRevision, r.members_revision = 4711;
    auto back = decode_request(encode(r));
    ASSERT_TRUE(back.ok()) << int(op) << ": " << back.status().to_string();
    EXPECT_EQ(back->flags, kMembersRevision) << int(op);
    EXPECT_EQ(back->members_revision, 4711) << int(op);
    EXPECT_EQ(back->context, r.context) << int(op) << ": the fields after it where they were";
    r.flags = 0;
    back = decode_request(encode(r));
    ASSERT_TRUE(back.ok()) << int(op);
    EXPECT_EQ(back->members_revision, 0) << int(op) << ": not sent without the flag";
  }
  // Beside the op's own flag, either way round on the wire.
  Request s = request(Op::stat);
  s.flags = kStatVersions | kMembersRevision, s.members_revision = 12;
  auto back = decode_request(encode(s));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->flags, kStatVersions | kMembersRevision);
  Request rm = request(Op::remove);
  rm.flags = kRemoveUpTo | kMembersRevision, rm.version = 77, rm.members_revision = 12;
  back = decode_request(encode(rm));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->version, 77u);
  EXPECT_EQ(back->members_revision, 12);
}

TEST(MemberSetsWire, ARevisionOutOfPlaceOrOutOfBoundsIsMalformed) {
  for (const int64_t bad : {int64_t(0), int64_t(-3)}) {
    Request r = request(Op::get);
    r.flags = kMembersRevision, r.members_revision = bad;
    EXPECT_EQ(decode_request(encode(r)).status().code(), StatusCode::corrupt_data) << bad;
  }
  Request auth;
  auth.op = Op::auth, auth.name_space = "tenant", auth.flags = kMembersRevision, auth.members_revision = 3;
  EXPECT_EQ(decode_request(encode(auth)).status().code(), StatusCode::corrupt_data) << "on a login";
  // The flag without the eight bytes after the level: every cut short of them fails.
  Request g = request(Op::get);
  g.flags = kMembersRevision, g.members_revision = 3;
  const auto whole = encode(g);
  for (size_t cut = 0; cut < whole.size(); ++cut)
    EXPECT_FALSE(decode_request(std::span(whole).first(cut)).ok()) << cut;
  // Stat's flag on a get still is not one.
  g.flags = kMembersRevision | kStatVersions;
  EXPECT_EQ(decode_request(encode(g)).status().code(), StatusCode::corrupt_data);
}

TEST(MemberSetsWire, TheAnswerSaysTheNodesSetIsNewerBesideItsCode) {
  for (const StatusCode code : {StatusCode::ok, StatusCode::not_found, StatusCode::no_space,
                                StatusCode::resource_exhausted}) {
    for (const bool newer : {false, true}) {
      Response r;
      r.op = Op::get, r.id = 5, r.code = code, r.members_newer = newer;
      auto back = decode_response(encode(r));
      ASSERT_TRUE(back.ok()) << back.status().to_string();
      EXPECT_EQ(back->code, code) << "the detail's other bits refine the code as before";
      EXPECT_EQ(back->members_newer, newer);
    }
  }
}

TEST(MemberSetsWire, TheLinkKeepsTheNewestOfEach) {
  MembersLink link;
  std::vector<int64_t> heard;
  link.on_newer = [&](int64_t told) { heard.push_back(told); };
  EXPECT_EQ(link.revision(), 0) << "no set yet: requests name none";
  link.set_revision(40);
  link.set_revision(30);
  EXPECT_EQ(link.revision(), 40) << "never moves back";
  link.node_is_newer(40);
  link.node_is_newer(12);  // an answer to a request sent before the set moved
  EXPECT_EQ(link.newer_than_told(), 41);
  EXPECT_EQ(heard, (std::vector<int64_t>{41, 13})) << "each answer is heard";
}

}  // namespace
}  // namespace kvstream::storage
