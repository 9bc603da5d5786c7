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

void metric(std::string& out, const char* name, const char* type, const char* help, uint64_t value) {
  fmt::format_to(std::back_inserter(out), "# HELP kvstream_node_{0} {1}\n# TYPE kvstream_node_{0} {2}\nkvstream_node_{0} {3}\n",
                 name, help, type, value);
}

}  // namespace

std::string metrics_text(const Server::Counters& c, const std::vector<Server::NamespaceUsage>& usage) {
  std::string out;
  metric(out, "requests_total", "counter", "Requests served.", c.requests);
  metric(out, "errors_total", "counter", "Requests answered with an error.", c.errors);
  metric(out, "bytes_out_total", "counter", "Body bytes sent (gets).", c.bytes_out);
  metric(out, "bytes_in_total", "counter", "Body bytes received (puts).", c.bytes_in);
  metric(out, "cache_hits_total", "counter", "Gets served from the in-memory cache.", c.cache_hits);
  metric(out, "auth_failures_total", "counter", "Failed logins.", c.auth_failures);
  metric(out, "refused_connections_total", "counter", "Connections closed before or at login (limits).",
         c.refused_connections);
  metric(out, "evicted_unauthenticated_total", "counter", "Connections not yet logged in replaced by newer ones.",
         c.evicted_unauthenticated);
  metric(out, "budget_refusals_total", "counter", "Requests answered resource_exhausted for memory.",
         c.budget_refusals);
  metric(out, "quota_refusals_total", "counter", "Puts answered no_space for their namespace's quota.",
         c.quota_refusals);
  metric(out, "budget_peak_bytes", "gauge", "Most memory held from the budget at once.", c.budget_peak_bytes);
  metric(out, "budget_limit_bytes", "gauge", "The memory budget.", c.budget_limit_bytes);
  metric(out, "objects_reencrypted_total", "counter", "Objects rewritten under the current at-rest key.",
         c.objects_reencrypted);
  metric(out, "objects_under_old_keys", "gauge", "Objects stored under another at-rest key (or in clear).",
         c.objects_under_old_keys);
  out += "# HELP kvstream_node_namespace_stored_bytes Payload bytes a namespace keeps on this node.\n"
         "# TYPE kvstream_node_namespace_stored_bytes gauge\n";
  for (const auto& u : usage)
    fmt::format_to(std::back_inserter(out), "kvstream_node_namespace_stored_bytes{{namespace=\"{}\"}} {}\n",
                   label_value(u.name_space), u.stored_bytes);
  out += "# HELP kvstream_node_namespace_quota_bytes A namespace's quota on this node (0: no bound).\n"
         "# TYPE kvstream_node_namespace_quota_bytes gauge\n";
  for (const auto& u : usage)
    fmt::format_to(std::back_inserter(out), "kvstream_node_namespace_quota_bytes{{namespace=\"{}\"}} {}\n",
                   label_value(u.name_space), u.quota_bytes);
  return out;
}

}  // namespace kvstream::storage
