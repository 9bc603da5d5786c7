// Status codes on the storage wire keep their numbers whatever the API's enum does.
#include <gtest/gtest.h>

#include "storage/wire_status.hpp"

namespace kvstream::test_wire_status {

using kvstream::StatusCode;
using kvstream::storage::from_wire;
using kvstream::storage::to_wire;

TEST(WireStatus, EveryApiCodeRoundTrips) {
  for (int c = 0; c <= int(StatusCode::internal); ++c) {
    auto back = from_wire(to_wire(StatusCode(c)));
    ASSERT_TRUE(back.ok()) << c;
    EXPECT_EQ(*back, StatusCode(c));
  }
}

TEST(WireStatus, NumbersAreTheDocumentedOnes) {
  // docs/protocol.md lists these; a peer of another version reads them so.
  EXPECT_EQ(to_wire(StatusCode::ok), 0);
  EXPECT_EQ(to_wire(StatusCode::not_found), 3);
  EXPECT_EQ(to_wire(StatusCode::corrupt_data), 5);
  EXPECT_EQ(to_wire(StatusCode::permission_denied), 10);
  EXPECT_EQ(to_wire(StatusCode::internal), 13);
}

TEST(WireStatus, UnknownNumbersAreCorrupt) {
  for (int n : {14, 99, 255}) {
    auto r = from_wire(uint8_t(n));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::corrupt_data);
  }
}

}  // namespace kvstream::test_wire_status
