// A storage node's counters and its tenants' usage in the Prometheus text exposition
// format (version 0.0.4), which kvstream-server serves at /metrics (--metrics).
// Every name starts with kvstream_node_; counters end in _total.
#pragma once

#include <string>
#include <vector>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

std::string metrics_text(const Server::Counters& c, const std::vector<Server::NamespaceUsage>& usage);

}  // namespace kvstream::storage
