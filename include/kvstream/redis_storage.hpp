// A storage::Client over Redis, for deployments that already run Redis and want it
// to hold encoded chunks. The pipeline and the adaptive fetch use it unchanged. It
// speaks RESP on its own sockets, in clear or over TLS (RedisConfig::tls), and parses
// replies with hiredis.
//
// Keys (namespace and context ids are validated as for the native node, so they never
// contain ':'):
//   kvs:{namespace}:{context}:{chunk}:{level}  the chunk: u64 xxh3-64 of the payload
//                                              seeded with the key (little-endian),
//                                              then the payload
//   kvs:{namespace}:{context}:{chunk}:{level}:blocks
//                                              u64 xxh3-64 per 64 KiB block of the
//                                              payload, seeded with the key and the
//                                              block's index (range reads)
//   kvs:{namespace}:{context}:sizes            hash "chunk:level" -> payload bytes (stat)
//   kvs:{namespace}:{context}:parts            hash "chunk:level" -> the parts table
//                                              (u64 end, f64 score per part), only
//                                              for objects put with parts (stat)
//   kvs:{namespace}:contexts                   set of context ids (list)
// A put writes all of them in one MULTI/EXEC transaction (a put without parts deletes
// the object's parts entry in it), and stat reads sizes and parts in one, so a parts
// table is always that of the bytes stored beside it. A get verifies the checksum
// (the native protocol's xxh3-64, storage/protocol.hpp) before copying the payload
// into the caller's buffer: one copy, as hiredis owns the reply. A range get reads,
// in one MULTI/EXEC, the value's length, the 64 KiB blocks that hold the range
// (GETRANGE) and their sums, verifies each block and copies out the range (at most
// two blocks' worth more than the range crosses the wire); a value stored without
// block sums (by a client before range reads) is read whole and verified instead.
//
// Redis Cluster (RedisConfig::cluster) spreads a context's chunks over the shards:
// every key of one chunk carries the hash tag {<namespace>:<context>:<chunk>}, so all
// its levels (and their tables) share a slot and one MULTI/EXEC still writes them:
//   kvs:{<ns>:<ctx>:<chunk>}:<level>           the chunk, as above
//   kvs:{<ns>:<ctx>:<chunk>}:<level>:blocks    its block sums, as above
//   kvs:{<ns>:<ctx>:<chunk>}:sizes, :parts     the chunk's size and parts tables
//                                              (fields "chunk:level", as above)
//   kvs:{<ns>:<ctx>}:chunks                    set of the context's chunk numbers
//   kvs:{<ns>}:contexts                        set of context ids (list)
// A put adds the context and the chunk to their sets first, then writes the chunk's
// keys in one transaction, each step waiting for `put_replicas` replicas (WAIT): a
// put that returned ok is listed by stat and survives a failover. The client routes
// by the slot map (CLUSTER SHARDS, else CLUSTER SLOTS), follows MOVED (and refreshes
// the map) and ASK, retries TRYAGAIN and CLUSTERDOWN within the call's deadline, and
// reads from a replica when the primary is down or slower than `replica_after`.
// docs/storage-backends.md says when to use it.
//
// TLS (RedisConfig::tls, for redis-server's tls-port): TLS 1.3, the server's
// certificate verified against tls.ca_file (else the system's store) and required
// to name the host connected to (DNS or IP SAN) or tls.server_name; tls.cert_file
// and tls.key_file give a client certificate for tls-auth-clients. A cluster client
// uses TLS to every node, those it learns from CLUSTER SLOTS and MOVED included: a
// cluster with tls-cluster yes reports its TLS ports to TLS clients, and by default
// its nodes by IP address, so the nodes' certificates must name those addresses (or
// all carry the one name set as tls.server_name). The record layer stays in user
// space (tls.kernel_tls is not used here).
//
// Encryption at rest (RedisConfig::at_rest.key_file): each value is sealed with
// AES-256-GCM under the namespace's tenant key, in 64 KiB blocks each with its tag,
// bound to its key name and size (the layout is in storage/redis/redis_seal.hpp);
// the sealed value replaces the clear value and its :blocks sums. A value that fails
// authentication is corrupt_data and never delivered; one sealed under a key id the
// key file no longer holds, or read by a client without a key file, is
// permission_denied. Values stored in clear before encryption was turned on stay
// readable unless read_clear_values is false. Key names, sizes, parts tables and the
// context sets stay in clear.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvstream/security.hpp"
#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"
#include "kvstream/transport.hpp"

namespace kvstream::redis {

/// Settings of the Redis storage client (defaults documented per field).
struct RedisConfig {
  /// "host:port", or "unix:/path/to/redis.sock" for a Unix socket.
  std::string address = "127.0.0.1:6379";
  std::string password;                       ///< sent with AUTH when not empty
  uint32_t database = 0;                      ///< SELECTed when not 0
  std::string name_space = "default";         ///< key prefix, validated like storage namespaces
  uint32_t connections = 2;                   ///< connections, each served by one thread (1..64)
  std::chrono::milliseconds connect_timeout{2000};  ///< bound on (re)connecting, within each call's deadline
  /// Redis Cluster (or Valkey in cluster mode): `address` and `seeds` are nodes to learn
  /// the topology from, and keys follow the cluster layout above. false: one server.
  bool cluster = false;
  std::vector<std::string> seeds;  ///< cluster: more nodes to ask for the topology
  /// Cluster: a read its primary has not answered within this long goes to a replica
  /// (as does one whose primary cannot be reached).
  std::chrono::milliseconds replica_after{250};
  /// Cluster: a put is acknowledged once this many replicas of its shard hold it
  /// (WAIT), so that a failover cannot lose it. 0 for a cluster without replicas, where
  /// a failover can lose the writes of its last moments.
  uint32_t put_replicas = 1;
  /// TLS to Redis (every node of a cluster). Off by default. require_client_cert
  /// and kernel_tls do not apply to a Redis client.
  TlsSettings tls;
  /// Encryption of values at rest: a key file seals every value put from now on.
  AtRestSettings at_rest;
  /// With at_rest on: whether a value found in clear (stored before encryption was
  /// turned on) is still read. true keeps old data readable; false refuses it
  /// (corrupt_data) once it is gone, so that a value written into Redis by someone
  /// without the key file is never delivered.
  bool read_clear_values = true;
};

/// True when kvstream was built with hiredis (KVSTREAM_WITH_REDIS).
bool available() noexcept;

/// Connects (and checks the server with PING). Every call of the returned client
/// keeps its deadline (each wait on the socket, the TLS handshake's included, is
/// bounded by the time left; a connection that timed out is reopened for the next
/// call) and its cancel token (the call completes with cancelled within about 10 ms;
/// the command's late reply is discarded, and the caller's buffer is never touched
/// after the callback). register_memory accepts any host buffer. Errors: unsupported
/// (built without hiredis), invalid_argument (also: bad TLS files, TLS over a Unix
/// socket), not_found (no key file), permission_denied (AUTH refused, a certificate
/// refused either way), unavailable, timed_out, cancelled, corrupt_data (TLS to a
/// port that does not serve it).
Result<std::unique_ptr<storage::Client>> connect(const RedisConfig& config, transport::Deadline deadline,
                                                 const transport::CancelToken& cancel = {});

}  // namespace kvstream::redis
