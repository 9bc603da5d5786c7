#include "storage/node/metrics_text.hpp"

#include <fmt/format.h>

namespace kvstream::storage {
namespace {

// A label value as the format wants it: backslash, double quote and newline escaped.
// (Namespace ids are validated to plain characters, but the text must hold whatever
// it is given.)
std::string label_value(const std::string& v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\') out += "\\\\";
    else if (ch == '"') out += "\\\"";
    else if (ch == '\n') out += "\\n";
    else out += ch;
  }
  return out;
}

}  // namespace

std::string metrics_text(const Server::Counters& c, const std::vector<Server::NamespaceUsage>& usage) {
  struct Metric {
    const char* name;
    bool counter;  // else a gauge
    const char* help;
    uint64_t value;
  };
  const Metric table[] = {
      {"requests_total", true, "Requests served.", c.requests},
      {"errors_total", true, "Requests answered with an error.", c.errors},
      {"bytes_out_total", true, "Body bytes sent (gets).", c.bytes_out},
      {"bytes_in_total", true, "Body bytes received (puts, touches).", c.bytes_in},
      {"cache_hits_total", true, "Gets served from the in-memory cache.", c.cache_hits},
      {"auth_failures_total", true, "Failed logins.", c.auth_failures},
      {"refused_connections_total", true, "Connections closed before or at login (limits).", c.refused_connections},
      {"evicted_unauthenticated_total", true, "Connections not yet logged in replaced by newer ones.",
       c.evicted_unauthenticated},
      {"budget_refusals_total", true, "Requests answered resource_exhausted for memory.", c.budget_refusals},
      {"quota_refusals_total", true, "Puts answered no_space for their namespace's quota.", c.quota_refusals},
      {"use_marks_raised_total", true, "Contexts whose use mark a touch raised (what eviction by use orders by).",
       c.use_marks_raised},
      {"removes_remembered", false, "Removed contexts whose older copies the node refuses (docs/protocol.md, Removes).",
       c.removes_remembered},
      {"fenced_gets_total", true,
       "Gets of objects held from before the node rejoined its cluster, answered not_found until its members had "
       "rebalanced (docs/protocol.md, Removes).",
       c.fenced_gets},
      {"fenced", false,
       "1 while the objects the node held before it (re)joined its cluster are not served: its members have not "
       "all reported their passes for its return (docs/protocol.md, Removes).",
       c.fenced},
      {"budget_peak_bytes", false, "Most memory held from the budget at once.", c.budget_peak_bytes},
      {"budget_limit_bytes", false, "The memory budget.", c.budget_limit_bytes},
      {"objects_reencrypted_total", true, "Objects rewritten under the current at-rest key.", c.objects_reencrypted},
      {"objects_under_old_keys", false, "Objects stored under another at-rest key (or in clear).",
       c.objects_under_old_keys},
  };
  std::string out;
  auto write = [&](const Metric& m) {
    fmt::format_to(std::back_inserter(out),
                   "# HELP kvstream_node_{0} {1}\n# TYPE kvstream_node_{0} {2}\nkvstream_node_{0} {3}\n", m.name,
                   m.help, m.counter ? "counter" : "gauge", m.value);
  };
  for (const Metric& m : table) write(m);
  // Only where the transport keeps per-peer state (libfabric): a node that served
  // many short-lived clients shows here whether it still holds them.
  if (c.transport_peer_entries)
    write({"transport_peer_entries", false, "Peers the transport keeps state for apart from their connections.",
           *c.transport_peer_entries});
  // Only where the transport can be sent messages no receive takes and sweeps them
  // (UCX, libfabric over ofi_rxm): what a peer's guesses, or clients cut short, cost
  // the node.
  if (c.transport_strays) {
    write({"transport_strays_dropped_total", true,
           "Messages under tags no receive would take (a closed connection's, a peer's guesses) the transport "
           "dropped.",
           c.transport_strays->messages});
    write({"transport_stray_bytes_total", true, "Bytes of those messages, as sent.", c.transport_strays->bytes});
  }
  // Per namespace: one family each, a sample per namespace.
  const struct {
    const char* name;
    const char* help;
    uint64_t Server::NamespaceUsage::*field;
  } families[] = {
      {"namespace_stored_bytes", "Bytes a namespace keeps on this node's disk, as its quota counts them.",
       &Server::NamespaceUsage::stored_bytes},
      {"namespace_quota_bytes", "A namespace's quota on this node (0: no bound).",
       &Server::NamespaceUsage::quota_bytes},
  };
  for (const auto& f : families) {
    fmt::format_to(std::back_inserter(out), "# HELP kvstream_node_{0} {1}\n# TYPE kvstream_node_{0} gauge\n", f.name,
                   f.help);
    for (const auto& u : usage)
      fmt::format_to(std::back_inserter(out), "kvstream_node_{}{{namespace=\"{}\"}} {}\n", f.name,
                     label_value(u.name_space), u.*(f.field));
  }
  return out;
}

}  // namespace kvstream::storage
