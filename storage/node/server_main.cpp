// kvstream-server: a storage node serving encoded chunks over any backend.
//
// It takes the settings its clients take (StoreConfig, from the environment and
// --set name=value): storage.address is where it listens, storage.backend its
// transport, storage.namespace with storage.secret a tenant it serves (beside those of
// --secrets), storage.tls* its TLS (its own certificate and key, its clients' CA),
// storage.at_rest_key_file its encryption at rest, log.level its log. --describe
// lists them. Flags win over --set, which
// wins over the environment.
#include <csignal>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvstream/storage.hpp"
#include "kvstream/store_config.hpp"
#include "core/text.hpp"
#include "storage/node/metrics_listener.hpp"
#include "storage/node/metrics_text.hpp"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }
volatile std::sig_atomic_t g_reload_keys = 0;  // SIGHUP: reread the at-rest key file, the quotas, the metrics token
void on_hangup(int) { g_reload_keys = 1; }
}  // namespace

// Reads a JSON object of `what` ("strings") from `path` into `out`; the error's text,
// or empty.
template <typename Value>
std::string read_json_map(const std::string& path, std::string_view what, std::map<std::string, Value>& out) {
  std::ifstream f(path);
  if (!f) return fmt::format("cannot read '{}'", path);
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (!j.is_object()) throw std::runtime_error("not an object");
    for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = it.value().get<Value>();
  } catch (const std::exception& e) {
    return fmt::format("'{}' is not a JSON object of {}: {}", path, what, e.what());
  }
  return {};
}

/// --namespace-quotas: a JSON object of namespace -> MiB, as bytes.
std::string read_quotas(const std::string& path, std::map<std::string, uint64_t>& bytes) {
  std::map<std::string, uint64_t> mib;
  if (auto err = read_json_map(path, "MiB counts", mib); !err.empty()) return err;
  bytes.clear();
  for (const auto& [ns, n] : mib) bytes[ns] = n << 20;
  return {};
}

/// --metrics-token-file: the bearer token a scraper must send, the file's first line
/// (surrounding spaces dropped); the error's text, or empty.
std::string read_token(const std::string& path, std::string& token) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return fmt::format("cannot read a token from '{}'", path);
  const std::string_view t = kvstream::trim(line);
  if (t.empty()) return fmt::format("'{}' holds no token on its first line", path);
  token = std::string(t);
  return {};
}

int main(int argc, char** argv) {
  CLI::App app{"kvstream storage node"};
  kvstream::storage::ServerConfig cfg;
  std::string secrets_file;
  std::vector<std::string> sets, transport_sets;
  bool describe = false;
  auto shared = kvstream::StoreConfig::from_env();
  if (!shared.ok()) return fmt::print(stderr, "kvstream-server: {}\n", shared.status().to_string()), 1;
  uint64_t cache_mb = cfg.cache_bytes >> 20, budget_mb = 0;
  uint64_t auth_ms = uint64_t(cfg.auth_timeout.count()), idle_ms = uint64_t(cfg.idle_timeout.count());
  auto* listen = app.add_option("--listen", cfg.address, "host:port to listen on (default: storage.address)");
  auto* backend = app.add_option("--backend", cfg.backend.name, "tcp, ucx or libfabric (default: storage.backend)");
  app.add_option("--set", sets, "a shared setting, name=value (repeatable; see --describe)");
  app.add_flag("--describe", describe, "list the shared settings with their values and defaults, then exit");
  app.add_option("--transport", transport_sets,
                 "a transport backend setting, name=value (repeatable; e.g. tcp.queue_depth=128; see --describe)");
  app.add_option("--ucx-tls", cfg.backend.ucx.tls, "UCX transports (UCX_TLS)");
  app.add_option("--ofi-provider", cfg.backend.libfabric.provider, "libfabric provider")->capture_default_str();
  app.add_option("--dir", cfg.directory, "storage directory (required)");
  auto& tls = cfg.backend.tcp.tls;
  std::string tls_clients_file;
  bool clear_text = false;
  app.add_option("--tls-cert", tls.cert_file, "TLS 1.3 on (tcp): this node's PEM certificate chain");
  app.add_option("--tls-key", tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", tls.ca_file, "PEM authorities of client certificates (asks clients for one)");
  app.add_flag("--tls-require-client-cert", tls.require_client_cert, "refuse clients without a certificate");
  app.add_option("--tls-clients", tls_clients_file,
                 "JSON file {\"namespace\": [\"certificate name\", ...], ...}: namespaces clients log into by "
                 "certificate (mutual TLS)");
  app.add_flag("--clear-text", clear_text,
               "serve in clear text on an address other than loopback (refused without it when TLS is off)");
  app.add_option("--secrets", secrets_file,
                 "JSON file {\"namespace\": \"secret\", ...} (secrets of at least 16 bytes); or storage.namespace "
                 "and storage.secret");
  app.add_option("--cache-mb", cache_mb, "in-memory cache of hot chunks")->capture_default_str();
  app.add_option("--memory-budget-mb", budget_mb,
                 "bound on memory held for requests (cache + bodies in flight); 0 = cache + 256")
      ->capture_default_str();
  app.add_option("--max-connections", cfg.max_connections, "authenticated connections")->capture_default_str();
  app.add_option("--max-connections-per-namespace", cfg.max_connections_per_namespace,
                 "connections one namespace may hold")
      ->capture_default_str();
  app.add_option("--max-unauthenticated", cfg.max_unauthenticated,
                 "connections not yet authenticated (the oldest gives way to a new one)")
      ->capture_default_str();
  app.add_option("--max-unauthenticated-per-source", cfg.max_unauthenticated_per_source,
                 "unauthenticated connections from one address")
      ->capture_default_str();
  app.add_option("--auth-timeout-ms", auth_ms, "time a connection has to authenticate")->capture_default_str();
  app.add_option("--idle-timeout-ms", idle_ms, "a silent client is disconnected after this")->capture_default_str();
  uint64_t remove_memory_s = uint64_t(cfg.remove_memory.count());
  app.add_option("--remove-memory-s", remove_memory_s,
                 "how long a remove is remembered, so that older copies of the context are refused; in a cluster a "
                 "node last a member longer ago drops what it held at start (0: not at all)")
      ->capture_default_str();
  app.add_option("--max-removes-remembered", cfg.max_removes_remembered,
                 "removes remembered at most (past it, the oldest of the namespace holding the most are forgotten)")
      ->capture_default_str();
  auto& m = cfg.membership;
  uint64_t lease_s = uint64_t(m.etcd.lease_ttl.count()), rebalance_mb = m.bytes_per_second >> 20;
  app.add_option("--etcd", m.etcd.endpoints,
                 "etcd client URL (repeatable): register in etcd and rebalance chunks when nodes join or leave");
  app.add_option("--etcd-prefix", m.etcd.prefix, "key prefix of this cluster in etcd")->capture_default_str();
  app.add_option("--advertise", m.advertise, "host:port other nodes and clients reach this node at (default: --listen)");
  app.add_option("--replication", m.replication, "R: nodes holding each chunk (as the clients')")->capture_default_str();
  app.add_option("--virtual-nodes", m.virtual_nodes, "ring points per node (as the clients')")->capture_default_str();
  app.add_option("--lease-ttl-s", lease_s, "etcd lease: a node silent this long leaves the membership")
      ->capture_default_str();
  app.add_option("--rebalance-mb-per-s", rebalance_mb, "bound on this node's copy rate after a change (0: none)")
      ->capture_default_str();
  uint64_t settle_ms = uint64_t(m.settle.count());
  app.add_option("--rebalance-settle-ms", settle_ms,
                 "membership changes this close together are rebalanced in one pass (the pass starts this long after "
                 "the first)")
      ->capture_default_str();
  bool keep_surplus = !m.trim_surplus;
  app.add_flag("--keep-surplus-copies", keep_surplus,
               "after a rebalance keep the copies of chunks this node no longer owns (default: dropped once every "
               "member has copied and each owner holds the same write or a newer one)");
  uint64_t quota_mb = 0;
  std::string quotas_file;
  app.add_option("--namespace-quota-mb", quota_mb,
                 "MiB each namespace may keep on this node's disk (each object's file in whole allocation units, 4 KiB on "
                 "most file systems); puts past it are refused (0: no bound)")
      ->capture_default_str();
  app.add_option("--namespace-quotas", quotas_file,
                 "JSON object of namespace -> MiB, overriding --namespace-quota-mb for those namespaces (reread "
                 "on SIGHUP)");
  std::string metrics_address, metrics_token_file;
  bool metrics_tls = false;
  app.add_option("--metrics", metrics_address,
                 "host:port to serve the node's counters and each namespace's stored bytes and quota at GET "
                 "/metrics (Prometheus text; plain HTTP unless --metrics-tls: loopback or a management network; "
                 "port 0: any)");
  app.add_flag("--metrics-tls", metrics_tls, "serve /metrics over HTTPS (TLS 1.3) with --tls-cert and --tls-key");
  app.add_option("--metrics-token-file", metrics_token_file,
                 "file whose first line is the bearer token /metrics asks for (Authorization: Bearer <token>; "
                 "reread on SIGHUP); without it, no login");
  uint64_t reencrypt_mb = cfg.reencrypt_bytes_per_second >> 20;
  bool reencrypt_only = false;
  app.add_option("--at-rest-key-file", cfg.at_rest.key_file,
                 "encryption at rest: key file of lines \"<id> <64 hex>\" (highest id seals new writes; SIGHUP "
                 "rereads it and re-encrypts older objects in the background)");
  app.add_option("--reencrypt-mb-per-s", reencrypt_mb, "pace of re-encryption to the current key (0: none)")
      ->capture_default_str();
  app.add_flag("--reencrypt", reencrypt_only,
               "re-encrypt --dir under the current key of --at-rest-key-file (no node may serve it), then exit");
  CLI11_PARSE(app, argc, argv);
  cfg.reencrypt_bytes_per_second = reencrypt_mb << 20;
  m.etcd.lease_ttl = std::chrono::seconds(lease_s);
  m.bytes_per_second = rebalance_mb << 20;
  m.trim_surplus = !keep_surplus;
  m.settle = std::chrono::milliseconds(settle_ms);
  for (const auto& s : sets)
    if (auto st = shared->set(s); !st.ok())
      return fmt::print(stderr, "kvstream-server: --set {}: {}\n", s, st.to_string()), 1;
  for (const auto& s : transport_sets)
    if (auto st = cfg.backend.set(s); !st.ok())
      return fmt::print(stderr, "kvstream-server: --transport {}: {}\n", s, st.to_string()), 1;
  if (describe) return fmt::print("{}\ntransport settings (--transport):\n{}", shared->describe(), cfg.backend.describe()), 0;
  if (cfg.directory.empty()) return fmt::print(stderr, "kvstream-server: --dir is required\n"), 1;
  if (auto st = shared->apply_log_level(); !st.ok())
    return fmt::print(stderr, "kvstream-server: {}\n", st.to_string()), 1;
  // The shared settings fill what no flag gave (flags win over --set).
  if (cfg.at_rest.key_file.empty()) cfg.at_rest = shared->storage.at_rest;
  if (cfg.backend.tcp.tls.cert_file.empty() && shared->storage.tls.enabled) cfg.backend.tcp.tls = shared->storage.tls;
  if (reencrypt_only) {
    auto r = kvstream::storage::reencrypt_store(cfg.directory, cfg.at_rest, cfg.reencrypt_bytes_per_second);
    if (!r.ok()) return fmt::print(stderr, "kvstream-server: --reencrypt: {}\n", r.status().to_string()), 1;
    fmt::print("re-encrypted {} objects ({} bytes); {} replaced meanwhile, {} under keys the key file lacks, {} failed; "
               "{} objects not under the current key\n",
               r->reencrypted, r->bytes, r->replaced, r->missing_key, r->failed, r->remaining);
    return r->failed == 0 && r->remaining == 0 ? 0 : 1;
  }
  if (!*listen) cfg.address = shared->storage.address;
  if (!*backend) cfg.backend.name = shared->storage.backend;
  if (!shared->storage.secret.empty()) cfg.secrets[shared->storage.name_space] = shared->storage.secret;
  if (secrets_file.empty() && cfg.secrets.empty() && tls_clients_file.empty())
    return fmt::print(stderr,
                      "kvstream-server: no tenants: give --secrets, --tls-clients, or storage.namespace and "
                      "storage.secret\n"),
           1;
  cfg.cache_bytes = cache_mb << 20;
  cfg.memory_budget_bytes = budget_mb << 20;
  cfg.auth_timeout = std::chrono::milliseconds(auth_ms);
  cfg.idle_timeout = std::chrono::milliseconds(idle_ms);
  cfg.remove_memory = std::chrono::seconds(remove_memory_s);

  if (!secrets_file.empty())
    if (auto err = read_json_map(secrets_file, "strings", cfg.secrets); !err.empty())
      return fmt::print(stderr, "kvstream-server: {}\n", err), 1;
  cfg.default_namespace_quota_bytes = quota_mb << 20;
  if (!quotas_file.empty())
    if (auto err = read_quotas(quotas_file, cfg.namespace_quota_bytes); !err.empty())
      return fmt::print(stderr, "kvstream-server: {}\n", err), 1;
  if (!tls.cert_file.empty()) tls.enabled = true;
  if (!tls_clients_file.empty())
    if (auto err = read_json_map(tls_clients_file, "string arrays", cfg.tls_clients); !err.empty())
      return fmt::print(stderr, "kvstream-server: {}\n", err), 1;
  const bool tls_on = cfg.backend.name == "tcp" && tls.enabled;
  if (!tls_on && !kvstream::transport::is_loopback_address(cfg.address)) {
    if (!clear_text)
      return fmt::print(stderr,
                        "kvstream-server: {} is not loopback and TLS is off: give --tls-cert and --tls-key, or "
                        "--clear-text to serve every chunk readable to anyone on the path\n",
                        cfg.address),
             1;
    fmt::print(stderr, "kvstream-server: warning: serving {} in clear text (--clear-text)\n", cfg.address);
  }
  std::string metrics_token;
  if (!metrics_token_file.empty() && metrics_address.empty())
    return fmt::print(stderr, "kvstream-server: --metrics-token-file needs --metrics\n"), 1;
  if (!metrics_token_file.empty())
    if (auto err = read_token(metrics_token_file, metrics_token); !err.empty())
      return fmt::print(stderr, "kvstream-server: --metrics-token-file: {}\n", err), 1;
  std::shared_ptr<const kvstream::security::TlsContext> metrics_tls_context;
  if (metrics_tls) {
    if (metrics_address.empty()) return fmt::print(stderr, "kvstream-server: --metrics-tls needs --metrics\n"), 1;
    if (tls.cert_file.empty() || tls.key_file.empty())
      return fmt::print(stderr, "kvstream-server: --metrics-tls needs --tls-cert and --tls-key\n"), 1;
    kvstream::TlsSettings m;  // the node's certificate; no client certificates asked for
    m.enabled = true, m.cert_file = tls.cert_file, m.key_file = tls.key_file;
    auto ctx = kvstream::security::TlsContext::create(m, kvstream::security::TlsRole::server);
    if (!ctx.ok()) return fmt::print(stderr, "kvstream-server: --metrics-tls: {}\n", ctx.status().to_string()), 1;
    metrics_tls_context = std::move(ctx).value();
  }
  if (!metrics_address.empty() && metrics_token.empty() && !kvstream::transport::is_loopback_address(metrics_address))
    fmt::print(stderr,
               "kvstream-server: warning: /metrics on {} answers anyone who reaches it (tenant names and usage); "
               "give --metrics-token-file\n",
               metrics_address);
  // Before anything is served: a SIGHUP that came between the first answers and the
  // handler ended the process (the default action), as a scraper or a client that saw
  // the node up may already send it.
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGHUP, on_hangup);
  auto server = kvstream::storage::Server::start(cfg);
  if (!server.ok()) return fmt::print(stderr, "kvstream-server: {}\n", server.status().to_string()), 1;
  fmt::print("listening on {}\n", (*server)->address());
  // Stopped before the node it reads (declared after it).
  std::unique_ptr<kvstream::storage::MetricsListener> metrics;
  if (!metrics_address.empty()) {
    auto m = kvstream::storage::MetricsListener::start(
        metrics_address,
        [node = server->get()] { return kvstream::storage::metrics_text(node->counters(), node->namespace_usage()); },
        std::move(metrics_token), metrics_tls_context);
    if (!m.ok()) return fmt::print(stderr, "kvstream-server: --metrics: {}\n", m.status().to_string()), 1;
    metrics = std::move(m).value();
    fmt::print("metrics on {}://{}/metrics\n", metrics_tls_context ? "https" : "http", metrics->address());
  }
  std::fflush(stdout);
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (g_reload_keys) {
      g_reload_keys = 0;
      if (!cfg.at_rest.key_file.empty())
        if (auto st = (*server)->reload_keys(); !st.ok())
          fmt::print(stderr, "kvstream-server: SIGHUP: keeping the keys in use: {}\n", st.to_string());
      if (!quotas_file.empty()) {
        std::map<std::string, uint64_t> quotas;
        if (auto err = read_quotas(quotas_file, quotas); !err.empty())
          fmt::print(stderr, "kvstream-server: SIGHUP: keeping the quotas in use: {}\n", err);
        else
          (*server)->set_namespace_quotas(cfg.default_namespace_quota_bytes, std::move(quotas));
      }
      if (metrics && !metrics_token_file.empty()) {
        std::string token;
        if (auto err = read_token(metrics_token_file, token); !err.empty())
          fmt::print(stderr, "kvstream-server: SIGHUP: keeping the metrics token in use: {}\n", err);
        else
          metrics->set_bearer_token(std::move(token));
      }
    }
  }
  metrics.reset();
  (*server)->stop();
  const auto c = (*server)->counters();
  fmt::print("served {} requests ({} errors, {} cache hits), {} bytes out, {} bytes in, {} failed logins\n", c.requests,
             c.errors, c.cache_hits, c.bytes_out, c.bytes_in, c.auth_failures);
  return 0;
}
