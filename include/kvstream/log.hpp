// Library-wide logging controls. kvstream logs through one logger ("kvstream",
// spdlog inside) to stderr; a host can lower or raise its level, silence it, or take
// every line itself by installing a sink (its own logger, a ring buffer, a test).
//
// Every error is logged once, where kvstream first makes it (make_status): `internal`
// at error; io_error, corrupt_data, unavailable, permission_denied and
// resource_exhausted at warn; no_space at info (a full store is a state its user
// handles, by eviction.when_full or its own removes); the codes a caller causes or
// expects (invalid_argument, out_of_range, not_found, already_exists, unsupported,
// timed_out, cancelled) at debug. Errors passed up the stack are not logged again. A peer that closes a
// connection between two messages is `unavailable` but logged at debug: for a node it
// is a client leaving; a storage client that loses waiting requests by it warns. What
// a peer causes at will on a connection a listener accepted (its framing, its TLS
// records, a handshake it never finishes, resets), on every backend, is logged at debug
// too: the storage node counts those in its rate-limited log instead of writing a line
// each.
#pragma once

#include <functional>
#include <string_view>

#include "kvstream/status.hpp"

namespace kvstream {

enum class LogLevel : uint8_t { trace, debug, info, warn, error, off };

/// Sets the level of kvstream's logger (default: info). StoreConfig's log.level
/// (KVSTREAM_LOG_LEVEL through StoreConfig::from_env) sets it when a KvStore opens.
void set_log_level(LogLevel level) noexcept;

/// Parses "trace", "debug", "info", "warn", "error" or "off".
Result<LogLevel> parse_log_level(std::string_view name);

/// "trace", "debug", "info", "warn", "error" or "off".
std::string_view log_level_name(LogLevel level) noexcept;

/// Receives each line kvstream logs at or above the level in force: its level and
/// its text (without timestamp or prefix; the view is valid during the call only).
/// It may be called from any kvstream thread, one call at a time, and must not log
/// through kvstream itself.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

/// Sends kvstream's log to `sink` instead of stderr; an empty sink restores stderr.
/// Takes effect for the next line logged by any thread. An exception thrown by the
/// sink is swallowed (the library never lets one cross into its own threads).
void set_log_sink(LogSink sink) noexcept;

}  // namespace kvstream
