// The books of a libfabric endpoint's address vector (transport/ofi/ofi_peer_table.hpp),
// without a provider: an entry is handed out for removal only once its connections and
// every operation posted to its peer have let it go, and one wanted again before its
// removal is used again, not inserted twice.
#include <gtest/gtest.h>

#if KVSTREAM_HAVE_LIBFABRIC
#include <algorithm>

#include "transport/ofi/ofi_peer_table.hpp"

namespace kvstream::test_ofi_peer_table {

using transport::ofi::PeerTable;

TEST(OfiPeerTable, AnEntryGoesOnlyAfterItsConnectionsAndOperationsLetGo) {
  auto table = PeerTable::create();
  EXPECT_FALSE(table->find("client-a").has_value());
  PeerTable::Use conn1 = table->add("client-a", 7);
  ASSERT_TRUE(conn1);
  EXPECT_EQ(conn1.addr(), 7u);
  auto conn2 = table->find("client-a");  // a second connection from the same endpoint
  ASSERT_TRUE(conn2.has_value());
  EXPECT_EQ(conn2->addr(), 7u);
  EXPECT_EQ(table->uses(7), 2u);
  {
    PeerTable::Use op = table->hold(conn1.addr());  // a send posted on connection 1
    EXPECT_EQ(table->uses(7), 3u);
    conn1 = {};
    conn2.reset();
    EXPECT_EQ(table->unused(), 0u) << "the send still names the peer";
    EXPECT_TRUE(table->take_unused().empty());
  }
  EXPECT_EQ(table->unused(), 1u);
  // Wanted again before it was removed: the same entry, not a second insert.
  auto again = table->find("client-a");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->addr(), 7u);
  EXPECT_EQ(table->unused(), 0u);
  again.reset();
  EXPECT_EQ(table->take_unused(), std::vector<fi_addr_t>{7});
  EXPECT_EQ(table->size(), 0u);
  EXPECT_EQ(table->unused(), 0u);
  EXPECT_FALSE(table->find("client-a").has_value()) << "a removed entry must be inserted anew";
}

TEST(OfiPeerTable, CopiesCountAndAnUnknownAddressHoldsNothing) {
  auto table = PeerTable::create();
  PeerTable::Use a = table->add("a", 1);
  PeerTable::Use b = table->add("b", 2);
  {
    PeerTable::Use copy = a;
    PeerTable::Use assigned;
    assigned = b;
    EXPECT_EQ(table->uses(1), 2u);
    EXPECT_EQ(table->uses(2), 2u);
    PeerTable::Use moved = std::move(copy);
    EXPECT_FALSE(copy);  // NOLINT(bugprone-use-after-move): a moved-from Use is empty
    EXPECT_EQ(table->uses(1), 2u);
  }
  EXPECT_EQ(table->uses(1), 1u);
  EXPECT_FALSE(table->hold(FI_ADDR_UNSPEC)) << "a receive from anyone names no peer";
  EXPECT_FALSE(table->hold(99));
  b = {};
  auto gone = table->take_unused();
  EXPECT_EQ(gone, std::vector<fi_addr_t>{2});
  EXPECT_EQ(table->size(), 1u);
  // A Use may outlive everything else that refers to the table.
  PeerTable::Use last = a;
  table.reset();
  a = {};
  EXPECT_EQ(last.addr(), 1u);
}

}  // namespace kvstream::test_ofi_peer_table
#endif
