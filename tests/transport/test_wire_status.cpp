// Status codes on the storage wire keep their numbers whatever the API's enum does.
#include <gtest/gtest.h>

#include "storage/protocol.hpp"
#include "storage/wire_status.hpp"

namespace kvstream::test_wire_status {

using kvstream::StatusCode;
using kvstream::storage::from_wire;
using kvstream::storage::to_wire;

TEST(WireStatus, EveryApiCodeRoundTrips) {
  for (int c = 0; c <= int(kvstream::kLastStatusCode); ++c) {
    const auto wire = to_wire(StatusCode(c));
    auto back = from_wire(uint8_t(wire.code), uint8_t(wire.detail));
    ASSERT_TRUE(back.ok()) << c;
    EXPECT_EQ(*back, StatusCode(c));
  }
}

// no_space travels as resource_exhausted with a detail byte: a client from before it
// (which ignores that byte) reads resource_exhausted, and a node from before it (which
// sends 0) is read as it meant. A detail this build does not know is ignored.
TEST(WireStatus, NoSpaceIsResourceExhaustedWithADetail) {
  const auto wire = to_wire(StatusCode::no_space);
  EXPECT_EQ(uint8_t(wire.code), 12);
  EXPECT_EQ(uint8_t(wire.detail), 1);
  EXPECT_EQ(*from_wire(12), StatusCode::resource_exhausted);
  EXPECT_EQ(*from_wire(12, 1), StatusCode::no_space);
  EXPECT_EQ(*from_wire(12, 200), StatusCode::resource_exhausted);
  EXPECT_EQ(*from_wire(3, 1), StatusCode::not_found);  // a detail of another code
  EXPECT_EQ(uint8_t(to_wire(StatusCode::resource_exhausted).detail), 0);
}

TEST(WireStatus, NumbersAreTheDocumentedOnes) {
  // docs/protocol.md lists these; a peer of another version reads them so.
  auto number = [](StatusCode c) { return int(to_wire(c).code); };
  EXPECT_EQ(number(StatusCode::ok), 0);
  EXPECT_EQ(number(StatusCode::not_found), 3);
  EXPECT_EQ(number(StatusCode::corrupt_data), 5);
  EXPECT_EQ(number(StatusCode::permission_denied), 10);
  EXPECT_EQ(number(StatusCode::internal), 13);
}

// The same through a whole response header, and as a node from before no_space sends it.
TEST(WireStatus, AResponseCarriesNoSpace) {
  kvstream::storage::Response r;
  r.op = kvstream::storage::Op::put, r.id = 7, r.code = StatusCode::no_space, r.message = "quota";
  auto header = kvstream::storage::encode(r);
  auto back = kvstream::storage::decode_response(header);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->code, StatusCode::no_space);
  header[7] = std::byte{0};  // magic (4), version, op, code, then the detail byte
  back = kvstream::storage::decode_response(header);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->code, StatusCode::resource_exhausted);
}

TEST(WireStatus, UnknownNumbersAreCorrupt) {
  for (int n : {14, 99, 255}) {
    auto r = from_wire(uint8_t(n));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::corrupt_data);
  }
}

}  // namespace kvstream::test_wire_status
