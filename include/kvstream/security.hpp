// Security settings shared by the parts that move or keep a tenant's KV cache: TLS
// for connections (the tcp backend, Redis) and the key file of encryption at rest
// (the storage node, the Redis client). docs/security.md says what each defends
// against and what it does not.
#pragma once

#include <string>

namespace kvstream {

/// TLS 1.3 (OpenSSL) on one side of a connection. Off by default: a clear listener
/// is opened only when TLS is off, and the tcp backend warns when it is not on
/// loopback.
struct TlsSettings {
  bool enabled = false;
  /// PEM certificate chain and private key of this side. A server needs both; a
  /// client gives them for mutual TLS (the server maps the certificate's names to
  /// namespaces).
  std::string cert_file, key_file;
  /// PEM file of the certificate authorities trusted to sign the peer's certificate.
  /// Client: empty means the system's store. Server: client certificates are asked
  /// for (and verified against it) only when it is set.
  std::string ca_file;
  /// Client: the name the server's certificate must carry; empty means the host part
  /// of the address connected to. Hostname verification is never skipped.
  std::string server_name;
  /// Server: refuse a client that presents no certificate (mutual TLS required).
  bool require_client_cert = false;
  /// Hand the record layer to the kernel (kTLS: SOL_TLS, the `tls` module) after the
  /// handshake where the kernel offers it, so sends and receives stay zero-copy on
  /// io_uring; user-space TLS otherwise. The path taken is logged per backend.
  bool kernel_tls = true;
};

/// Encryption at rest: AES-256-GCM per object under a per-tenant key derived with
/// HKDF-SHA256 from a key file's master keys.
struct AtRestSettings {
  /// Key file: one master key per line, "<id> <64 hex digits>" (ids 1..2^32-1, '#'
  /// starts a comment). The highest id encrypts new writes; every id listed can still
  /// be read, so a key is rotated by appending one and retired, once nothing uses it,
  /// by removing it. Empty: objects are stored in clear.
  std::string key_file;
};

}  // namespace kvstream
