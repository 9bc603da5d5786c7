// The names of shm endpoints this process has closed, which it must never reach again.
//
// libfabric's shm provider keeps a process-wide list of the names and mapped regions
// of the endpoints the process opens, so that an address vector entry for a peer in
// the same process points at that peer's region directly instead of mapping its file
// a second time. Closing an endpoint unmaps its region but leaves its entry in the
// list (libfabric 1.17; its newest source still does). A later insert of the same
// name, once a new endpoint took it (a listener opened again on a port an earlier one
// of this process had), finds the stale entry first and uses whatever is mapped at
// the old address now: another endpoint's queues, so messages go to the wrong
// endpoint, or nothing (SIGSEGV in libfabric's smr_cma_check). An insert of a closed
// name that nothing took again does the same. Under ASan, where freed mappings are
// not handed out again at once, EveryMessageArrivesOnFreshConnections crashed so in
// about 1 run in 40 when two of its fresh listeners drew the same port.
//
// So the backend remembers the names it closed, refuses to insert them (a connect or
// hello from this process to one is unavailable, with this reason), and a listener
// asked for any port (port 0) never takes one. Only names chosen by address
// ("fi_ns://host:port") are kept: the provider makes every other name unique within
// the process (a per-process counter), so the set grows with listeners closed, not
// with connections.
#pragma once

#include <string>
#include <string_view>

namespace kvstream::transport::ofi {

/// The name as the provider's list holds it: without its "fi_ns://" or "fi_shm://".
std::string shm_list_name(std::string_view name);

/// Records that this process closed the shm endpoint named `name` (an fi_getname
/// string); names not chosen by address are ignored.
void remember_closed_shm_name(std::string_view name);

/// Whether this process closed an shm endpoint named `name` (either spelling).
[[nodiscard]] bool shm_name_was_closed(std::string_view name);

}  // namespace kvstream::transport::ofi
