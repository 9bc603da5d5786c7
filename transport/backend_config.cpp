// The settings table of BackendConfig: every field once, with its name and meaning.
#include "core/settings_table.hpp"
#include "kvstream/transport_config.hpp"

namespace kvstream::transport {

// The text form of MemoryType, found by the table's field rows through its namespace.
std::string to_text(MemoryType t) { return std::string(memory_type_name(t)); }
Status from_text(std::string_view name, std::string_view v, MemoryType& out) {
  if (v == "host") out = MemoryType::host;
  else if (v == "cuda") out = MemoryType::cuda;
  else return settings::bad_value(name, v, "host or cuda");
  return {};
}

namespace {

const settings::Table<BackendConfig>& table() {
  using C = BackendConfig;
  static const settings::Table<BackendConfig> t({
      KVS_SETTING(C, "name", "backend: tcp, ucx or libfabric", name),
      KVS_SETTING(C, "memory", "memory type of message bodies: host or cuda", memory),
      KVS_SETTING(C, "tcp.queue_depth", "io_uring submission queue entries per connection (4..32768)",
                tcp.queue_depth),
      KVS_SETTING(C, "tcp.send_zc", "zero-copy sends (IORING_OP_SENDMSG_ZC) for bodies", tcp.send_zc),
      KVS_SETTING(C, "tcp.send_zc_min_bytes", "bodies smaller than this never use zero-copy", tcp.send_zc_min_bytes),
      KVS_SETTING(C, "tcp.socket_buffer_bytes", "SO_SNDBUF/SO_RCVBUF; 0: the kernel's autotuning",
                tcp.socket_buffer_bytes),
      KVS_SETTING(C, "tcp.tls.enabled", "TLS 1.3 on every connection; off: clear text", tcp.tls.enabled),
      KVS_SETTING(C, "tcp.tls.cert_file", "PEM certificate chain of this side (server; client for mutual TLS)",
                tcp.tls.cert_file),
      KVS_SETTING(C, "tcp.tls.key_file", "PEM private key of cert_file", tcp.tls.key_file),
      KVS_SETTING(C, "tcp.tls.ca_file",
                "PEM authorities trusted for the peer's certificate (client: empty = system store; server: asks "
                "for client certificates when set)",
                tcp.tls.ca_file),
      KVS_SETTING(C, "tcp.tls.server_name", "client: name the server's certificate must carry; empty = host connected to",
                tcp.tls.server_name),
      KVS_SETTING(C, "tcp.tls.require_client_cert", "server: refuse clients without a certificate (mutual TLS)",
                tcp.tls.require_client_cert),
      KVS_SETTING(C, "tcp.tls.kernel_tls", "hand the record layer to the kernel (kTLS) where it offers it",
                tcp.tls.kernel_tls),
      KVS_SETTING(C, "ucx.tls", "UCX transports (UCX_TLS syntax); empty: UCX's default", ucx.tls),
      KVS_SETTING(C, "ucx.peer_errors", "detect crashed peers promptly (costs cma on shared memory)", ucx.peer_errors),
      KVS_SETTING(C, "ucx.stage_limit_bytes", "bytes staged for messages that arrived before their receiver asked",
                ucx.stage_limit_bytes),
      KVS_SETTING(C, "libfabric.provider", "libfabric provider (FI_PROVIDER syntax)", libfabric.provider),
      KVS_SETTING(C, "libfabric.peer_timeout_ms",
                "a peer that answers no liveness probe for this long is taken as gone (0: no probes)",
                libfabric.peer_timeout),
  }, "");
  return t;
}

}  // namespace

Status BackendConfig::set(std::string_view name, std::string_view value) { return table().set(*this, name, value); }
Status BackendConfig::set(std::string_view assignment) { return table().set(*this, assignment); }
Result<std::string> BackendConfig::get(std::string_view name) const { return table().get(*this, name); }
std::string BackendConfig::describe() const { return table().describe(*this); }
std::vector<SettingInfo> backend_settings() { return table().info(); }

}  // namespace kvstream::transport
