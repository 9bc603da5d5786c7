// The shm endpoints of this process, and what libfabric's shm provider does with them
// that a process must work around.
//
// The provider keeps a process-wide list of the names and mapped regions of the
// endpoints the process opens, so that an address vector entry for a peer in the same
// process points at that peer's region directly instead of mapping its file a second
// time. Closing an endpoint unmaps its region but leaves its entry in the list
// (libfabric 1.17; its newest source still does). Two hazards follow:
//
// * A name closed and taken again. A later insert of the name, once a new endpoint
//   took it (a listener opened again on a port an earlier one of this process had),
//   finds the stale entry first and uses whatever is mapped at the old address now:
//   another endpoint's queues, so messages go to the wrong endpoint, or nothing
//   (SIGSEGV in smr_cma_check). An insert of a closed name that nothing took again
//   does the same. Under ASan, where freed mappings are not handed out again at once,
//   EveryMessageArrivesOnFreshConnections crashed so in about 1 run in 40 when two of
//   its fresh listeners drew the same port. So the backend remembers the names it
//   closed and refuses to insert them (a connect or hello from this process to one is
//   unavailable, with this reason), and a listener asked for any port (port 0) never
//   takes one. Only names chosen by address ("fi_ns://host:port") are kept: the
//   provider makes every other name unique within the process (a per-process counter).
//
// * A peer in this process that closes while another endpoint here still has it in
//   its address vector: a send to it, or the answer to one of its sends, writes into
//   the closed endpoint's unmapped region (SIGSEGV: a client sending while the node
//   in its process stopped, `libfabric.AnShmPeerInThisProcessThatGoesIsNoCrash`). So
//   an insert of a name that a live endpoint of this process holds is counted as a
//   hold, and an endpoint that closes while others hold it is parked instead: its
//   provider objects (and its region) stay open, unread, until the last hold ends
//   (the holder removes the entry, or closes), and are closed then. Sends to it find
//   its queues full and end by their deadline, or the connection's peer probes fail
//   it. A parked endpoint gives up its own holds at once: it never posts again, and
//   closing it touches no peer's region, so parked endpoints cannot wait on each other.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace kvstream::transport::ofi {

/// The name as the provider's list holds it: without its "fi_ns://" or "fi_shm://".
std::string shm_list_name(std::string_view name);

/// Whether this process closed an shm endpoint named `name` (either spelling) that
/// was chosen by address (a listener's): such a name is never inserted again.
[[nodiscard]] bool shm_name_was_closed(std::string_view name);

/// Whether the region of shm name `name` exists on this host (its file under
/// /dev/shm): a live endpoint of some process, or one a dead process left. The
/// provider cannot open another endpoint of that name (libfabric 1.17: fi_enable
/// fails EBUSY).
[[nodiscard]] bool shm_name_on_host(std::string_view name);

/// This process opened the shm endpoint `name` (its fi_getname string).
void shm_endpoint_opened(std::string_view name);

/// An endpoint of this process inserted `name` into its address vector: true where
/// that names a live endpoint of this process (the insert then holds it, until
/// shm_release).
[[nodiscard]] bool shm_hold(std::string_view name);

/// Ends one hold of `name`; closes the endpoint of that name if it is parked and this
/// was its last hold.
void shm_release(std::string_view name);

/// The provider objects of an shm endpoint, and what they need kept alive (the core
/// with its domain) until they are closed.
struct ShmEndpointObjects {
  fid_ep* ep = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  std::shared_ptr<void> keep;
};

/// The endpoint `name` of this process closes: its objects are closed now where no
/// endpoint here holds the name, else parked until the last hold ends. Either way a
/// name chosen by address is remembered as closed.
void shm_endpoint_closing(std::string_view name, ShmEndpointObjects objects);

/// Endpoints parked now (for tests and logs).
[[nodiscard]] size_t shm_endpoints_parked();

}  // namespace kvstream::transport::ofi
