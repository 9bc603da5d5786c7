// Settings of a transport backend: one struct per backend, nested in BackendConfig,
// every field with a name, default and meaning in one table (backend_settings()).
// A backend reads only its own part; set() takes "tcp.queue_depth=128" as the CLIs'
// --transport options do.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/security.hpp"
#include "kvstream/settings.hpp"
#include "kvstream/status.hpp"

namespace kvstream::transport {

/// Where a buffer lives.
enum class MemoryType : uint8_t { host = 0, cuda = 1 };

/// "host" or "cuda".
std::string_view memory_type_name(MemoryType t) noexcept;

/// The tcp backend (io_uring).
struct TcpSettings {
  uint32_t queue_depth = 64;  ///< io_uring submission queue entries per connection (4..32768)
  /// IORING_OP_SENDMSG_ZC for message bodies. Off: on loopback it measured slower than
  /// a plain send (docs/wire-tcp.md has the numbers).
  bool send_zc = false;
  uint64_t send_zc_min_bytes = 64 * 1024;  ///< bodies smaller than this never use zero-copy
  /// SO_SNDBUF / SO_RCVBUF; 0 leaves Linux's autotuning alone (it grows past what a
  /// fixed size capped at wmem_max/rmem_max gives).
  uint32_t socket_buffer_bytes = 0;
  /// TLS 1.3 on every connection of this backend (kernel TLS where the kernel has
  /// it, else user-space through OpenSSL): docs/security.md. Off: clear text.
  TlsSettings tls;
};

/// The UCX backend.
struct UcxSettings {
  std::string tls;  ///< transports (UCX_TLS); empty: UCX's default
  /// Peer error handling (a crashed peer is detected promptly). UCX 1.13 then cannot
  /// use cma for large shared-memory messages (~5x slower on shm); false trades prompt
  /// failure detection (a crash may show only as a timeout) for that.
  bool peer_errors = true;
  /// Bound on the bytes a backend stages for messages that arrived before their
  /// receiver asked (so a sender never waits on a slow reader up to this much).
  uint64_t stage_limit_bytes = uint64_t(512) << 20;
};

/// The libfabric backend.
struct LibfabricSettings {
  std::string provider = "tcp;ofi_rxm";  ///< provider (FI_PROVIDER syntax)
  /// A connection this side opened probes its peer while a call waits on it and the
  /// peer has said nothing for a quarter of this; a peer that answers no probe for
  /// this long is taken as gone, and the call fails with unavailable instead of
  /// waiting for its deadline (RDM has no connection for a killed peer to break).
  /// A single message (or read) that takes longer than this to arrive, with nothing
  /// else from the peer meanwhile, is taken for a lost peer too: raise it for such
  /// transfers. 0: no probes (a dead peer is seen at the call's deadline).
  std::chrono::milliseconds peer_timeout{4000};
};

/// Settings of one backend instance.
struct BackendConfig {
  std::string name = "tcp";              ///< "tcp", "ucx" or "libfabric"
  MemoryType memory = MemoryType::host;  ///< memory type bodies will use; one the backend lacks is an error
  TcpSettings tcp;
  UcxSettings ucx;
  LibfabricSettings libfabric;

  /// Sets one setting from text ("tcp.queue_depth", "128"). Errors: not_found (no such
  /// setting), invalid_argument (a value that does not parse).
  Status set(std::string_view name, std::string_view value);
  /// set() for "name=value".
  Status set(std::string_view assignment);
  /// The value of a setting as text. Errors: not_found.
  [[nodiscard]] Result<std::string> get(std::string_view name) const;
  /// Every setting, one per line: name, value in force, default, meaning.
  [[nodiscard]] std::string describe() const;
};

/// The table of BackendConfig, in declaration order (environment variables: none; a
/// host passes settings explicitly).
std::vector<SettingInfo> backend_settings();

}  // namespace kvstream::transport
