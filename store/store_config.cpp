// The settings table: every StoreConfig field once, with its name, meaning and how it
// reads and writes as text. from_env, set, get and describe all walk this one table,
// so a setting added here is documented, settable and read from the environment.
#include "kvstream/store_config.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

#include "kvstream/log.hpp"
#include <fmt/ranges.h>

namespace kvstream {
namespace {

using Setter = std::function<Status(StoreConfig&, std::string_view)>;
using Getter = std::function<std::string(const StoreConfig&)>;

struct Row {
  std::string_view name;
  std::string_view doc;
  Getter get;
  Setter set;
};

Status bad(std::string_view name, std::string_view value, std::string_view want) {
  return make_status(StatusCode::invalid_argument, "setting {}: '{}' is not {}", name, value, want);
}

template <typename T>
Result<T> parse_unsigned(std::string_view name, std::string_view v) {
  T out{};
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || v.empty()) return bad(name, v, "an unsigned integer");
  return out;
}

Result<double> parse_double(std::string_view name, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(d)) return bad(name, v, "a number");
  return d;
}

std::vector<std::string> split_list(std::string_view v) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= v.size() && !v.empty()) {
    const size_t comma = v.find(',', start);
    const std::string_view item = v.substr(start, comma == std::string_view::npos ? v.npos : comma - start);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// Row builders, one per field type: each reads and writes the member `m` of the part
// `part` of a StoreConfig.
template <typename Part>
Row text(std::string_view name, std::string_view doc, Part StoreConfig::*part, std::string Part::*m) {
  return {name, doc, [=](const StoreConfig& c) { return c.*part.*m; },
          [=](StoreConfig& c, std::string_view v) {
            c.*part.*m = std::string(v);
            return Status{};
          }};
}
template <typename Part, typename T>
Row uint(std::string_view name, std::string_view doc, Part StoreConfig::*part, T Part::*m) {
  return {name, doc, [=](const StoreConfig& c) { return fmt::format("{}", c.*part.*m); },
          [=](StoreConfig& c, std::string_view v) -> Status {
            KVS_ASSIGN_OR_RETURN(c.*part.*m, parse_unsigned<T>(name, v));
            return {};
          }};
}
template <typename Part>
Row sint(std::string_view name, std::string_view doc, Part StoreConfig::*part, int Part::*m) {
  return {name, doc, [=](const StoreConfig& c) { return fmt::format("{}", c.*part.*m); },
          [=](StoreConfig& c, std::string_view v) -> Status {
            int out = 0;
            auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
            if (ec != std::errc() || p != v.data() + v.size() || v.empty()) return bad(name, v, "an integer");
            c.*part.*m = out;
            return {};
          }};
}
template <typename Part>
Row real(std::string_view name, std::string_view doc, Part StoreConfig::*part, double Part::*m) {
  return {name, doc, [=](const StoreConfig& c) { return fmt::format("{}", c.*part.*m); },
          [=](StoreConfig& c, std::string_view v) -> Status {
            KVS_ASSIGN_OR_RETURN(c.*part.*m, parse_double(name, v));
            return {};
          }};
}
template <typename Part, typename Dur>
Row duration(std::string_view name, std::string_view doc, Part StoreConfig::*part, Dur Part::*m) {
  return {name, doc, [=](const StoreConfig& c) { return fmt::format("{}", (c.*part.*m).count()); },
          [=](StoreConfig& c, std::string_view v) -> Status {
            KVS_ASSIGN_OR_RETURN(auto n, parse_unsigned<uint64_t>(name, v));
            c.*part.*m = Dur(n);
            return {};
          }};
}
template <typename Part>
Row text_list(std::string_view name, std::string_view doc, Part StoreConfig::*part,
              std::vector<std::string> Part::*m) {
  return {name, doc, [=](const StoreConfig& c) { return fmt::format("{}", fmt::join(c.*part.*m, ",")); },
          [=](StoreConfig& c, std::string_view v) {
            c.*part.*m = split_list(v);
            return Status{};
          }};
}
const std::vector<Row>& table() {
  using S = StorageSettings;
  using C = CodecSettings;
  using P = PipelineSettings;
  using Y = PolicySettings;
  using E = EvictionSettings;
  using L = LogSettings;
  constexpr auto st = &StoreConfig::storage;
  constexpr auto co = &StoreConfig::codec;
  constexpr auto pi = &StoreConfig::pipeline;
  constexpr auto po = &StoreConfig::policy;
  constexpr auto ev = &StoreConfig::eviction;
  constexpr auto lg = &StoreConfig::log;
  static const std::vector<Row> rows = {
      text("storage.kind", "node (one kvstream-server), cluster (replicated nodes) or redis", st, &S::kind),
      text("storage.address", "host:port of the node, or of Redis", st, &S::address),
      text_list("storage.nodes", "cluster: host:port of every node, comma-separated", st, &S::nodes),
      uint("storage.replication", "cluster: nodes holding each chunk", st, &S::replication),
      text("storage.backend", "transport to the nodes: tcp, ucx or libfabric", st, &S::backend),
      text("storage.namespace", "namespace (tenant) on the nodes; key prefix on Redis", st, &S::name_space),
      text("storage.secret", "the namespace's secret (nodes); the password (Redis)", st, &S::secret),
      uint("storage.connections", "connections per node, or to Redis", st, &S::connections),
      duration("storage.connect_timeout_ms", "bound on connecting at open()", st, &S::connect_timeout),
      duration("storage.stat_reuse_ms", "a fetch reuses chunk sizes a lookup read this recently (0: asks again)", st,
               &S::stat_reuse),
      real("storage.paced_bits_per_second", "> 0: pace the link to this rate (demos, tests); 0: as fast as it goes",
           st, &S::paced_bits_per_second),
      text("codec.profile", "codec profile file (kvstream-profile writes one); required", co, &C::profile_path),
      text("codec.model_id", "id of the model whose KV is stored, part of every key; required", co, &C::model_id),
      uint("codec.chunk_tokens", "tokens per chunk; lookups and puts work in whole chunks", co, &C::chunk_tokens),
      uint("pipeline.depth", "receive buffers (chunks on the wire or waiting to decode)", pi, &P::depth),
      uint("pipeline.max_chunk_bytes", "size of each receive buffer; a larger chunk fails", pi, &P::max_chunk_bytes),
      uint("pipeline.decode_threads", "chunks decoding side by side", pi, &P::decode_threads),
      text("pipeline.decode", "where chunks decode: cpu, gpu or auto", pi, &P::decode),
      sint("pipeline.gpu_device", "CUDA device for gpu and auto", pi, &P::gpu_device),
      uint("pipeline.max_on_wire", "transfers requested and not landed, at most", pi, &P::max_on_wire),
      uint("pipeline.max_running", "fetches running at once; the rest wait, by priority", pi, &P::max_running),
      text("policy.chooser", "per-chunk level chooser: deadline or paper", po, &Y::chooser),
      text("policy.estimator", "throughput estimator: last, ewma, harmonic or percentile", po, &Y::estimator),
      real("policy.prior_bits_per_second", "link rate assumed before the first transfer", po,
           &Y::prior_bits_per_second),
      real("policy.max_quality_loss_pct", "worst perplexity increase (%) a level may have; < 0: no bound", po,
           &Y::max_quality_loss_pct),
      real("policy.recompute_tokens_per_second", "the runtime's prefill rate; > 0 lets chunks go as text", po,
           &Y::recompute_tokens_per_second),
      real("policy.decode_elements_per_second", "decode rate per worker (KV elements/s); 0: decode cost ignored",
           po, &Y::decode_elements_per_second),
      uint("eviction.max_bytes", "0: no bound; else the oldest chunks are removed until the store is under it", ev,
           &E::max_bytes),
      duration("eviction.max_age_s", "0: no bound; else chunks stored longer ago are removed", ev, &E::max_age),
      text("log.level", "the library's log level: trace, debug, info, warn, error or off", lg, &L::level),
  };
  return rows;
}

const Row* find(std::string_view name) {
  for (const auto& r : table())
    if (r.name == name) return &r;
  return nullptr;
}

std::string env_name(std::string_view name) {
  std::string e = "KVSTREAM_";
  for (char c : name) e += c == '.' ? '_' : char(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

}  // namespace

Result<StoreConfig> StoreConfig::from_env(StoreConfig base) {
  for (const auto& r : table()) {
    const std::string var = env_name(r.name);
    if (const char* v = std::getenv(var.c_str()))
      KVS_RETURN_IF_ERROR(r.set(base, v).with_context(fmt::format("environment variable {}", var)));
  }
  return base;
}

Status StoreConfig::set(std::string_view name, std::string_view value) {
  const Row* r = find(name);
  if (!r) return make_status(StatusCode::not_found, "no setting named '{}' (describe() lists them)", name);
  return r->set(*this, value);
}

Status StoreConfig::set(std::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos)
    return make_status(StatusCode::invalid_argument, "'{}' is not name=value", assignment);
  return set(assignment.substr(0, eq), assignment.substr(eq + 1));
}

Result<std::string> StoreConfig::get(std::string_view name) const {
  const Row* r = find(name);
  if (!r) return make_status(StatusCode::not_found, "no setting named '{}'", name);
  return r->get(*this);
}

std::vector<SettingInfo> store_settings() {
  const StoreConfig defaults;
  std::vector<SettingInfo> out;
  for (const auto& r : table()) out.push_back({r.name, r.doc, r.get(defaults), env_name(r.name)});
  return out;
}

std::string StoreConfig::describe() const {
  const StoreConfig defaults;
  std::string out;
  for (const auto& r : table()) {
    // A secret is never printed, only whether one is set.
    const bool secret = r.name == "storage.secret";
    std::string value = r.get(*this);
    if (secret && !value.empty()) value = "(set)";
    out += fmt::format("{} = {}  [default: {}; env {}]\n    {}\n", r.name, value.empty() ? "\"\"" : value,
                       secret ? "\"\"" : (r.get(defaults).empty() ? "\"\"" : r.get(defaults)), env_name(r.name), r.doc);
  }
  return out;
}

Status StoreConfig::apply_log_level() const {
  KVS_ASSIGN_OR_RETURN(LogLevel level, parse_log_level(log.level));
  set_log_level(level);
  return {};
}

Status StoreConfig::validate() const {
  auto bad_value = [](std::string_view what, auto v, std::string_view want) {
    return make_status(StatusCode::invalid_argument, "setting {} = {}: {}", what, v, want);
  };
  if (storage.kind != "node" && storage.kind != "cluster" && storage.kind != "redis")
    return bad_value("storage.kind", storage.kind, "must be node, cluster or redis");
  if (storage.kind == "cluster" && storage.nodes.empty())
    return bad_value("storage.nodes", "\"\"", "a cluster needs at least one node");
  if (storage.connections == 0) return bad_value("storage.connections", 0, "must be at least 1");
  if (storage.paced_bits_per_second < 0)
    return bad_value("storage.paced_bits_per_second", storage.paced_bits_per_second, "must be >= 0");
  if (codec.profile_path.empty()) return bad_value("codec.profile", "\"\"", "a codec profile is required");
  if (codec.model_id.empty()) return bad_value("codec.model_id", "\"\"", "a model id is required");
  if (codec.chunk_tokens == 0) return bad_value("codec.chunk_tokens", 0, "must be at least 1");
  if (pipeline.depth == 0) return bad_value("pipeline.depth", 0, "must be at least 1");
  if (pipeline.decode_threads == 0) return bad_value("pipeline.decode_threads", 0, "must be at least 1");
  if (pipeline.max_running == 0) return bad_value("pipeline.max_running", 0, "must be at least 1");
  if (policy.prior_bits_per_second <= 0)
    return bad_value("policy.prior_bits_per_second", policy.prior_bits_per_second, "must be > 0");
  if (!parse_log_level(log.level).ok()) return bad_value("log.level", log.level, "must be trace, debug, info, warn, error or off");
  if (policy.recompute_tokens_per_second < 0 || policy.decode_elements_per_second < 0)
    return make_status(StatusCode::invalid_argument, "policy rates must be >= 0");
  return {};
}

}  // namespace kvstream
