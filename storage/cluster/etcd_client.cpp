// etcd v3 through its JSON gateway with libcurl (storage/cluster/etcd_client.hpp).
#include "storage/cluster/etcd_client.hpp"

#if KVSTREAM_HAVE_ETCD
#include <curl/curl.h>
#endif
#include <openssl/evp.h>

#include <charconv>
#include <utility>
#include <nlohmann/json.hpp>

#include "core/log.hpp"

namespace kvstream::cluster {

using json = nlohmann::json;
using transport::CancelToken;
using transport::Clock;
using transport::Deadline;

std::string etcd_prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = char(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

#if KVSTREAM_HAVE_ETCD

namespace {

// curl_global_init is not thread-safe: once, before the first handle.
bool curl_ready() {
  static const bool ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  return ok;
}

std::string b64(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), int(s.size()));
  out.resize(size_t(n));
  return out;
}

Result<std::string> unb64(std::string_view s) {
  if (s.size() % 4 != 0) return make_status(StatusCode::corrupt_data, "etcd: base64 of {} characters", s.size());
  std::string out(3 * s.size() / 4, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), int(s.size()));
  if (n < 0) return make_status(StatusCode::corrupt_data, "etcd: a value is not base64");
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t len = size_t(n);
  for (size_t i = s.size(); i > 0 && s[i - 1] == '='; --i) --len;
  out.resize(len);
  return out;
}

// The gateway writes 64-bit integers as strings (proto3 JSON); absent means 0.
int64_t i64(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_string()) {
    const auto& str = it->get_ref<const std::string&>();
    int64_t v = 0;
    std::from_chars(str.data(), str.data() + str.size(), v);  // not a number: 0
    return v;
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

Result<EtcdKv> parse_kv(const json& j) {
  EtcdKv kv;
  KVS_ASSIGN_OR_RETURN(kv.key, unb64(j.value("key", "")));
  KVS_ASSIGN_OR_RETURN(kv.value, unb64(j.value("value", "")));
  kv.mod_revision = i64(j, "mod_revision");
  kv.lease = i64(j, "lease");
  return kv;
}

// nlohmann::json throws when a field has another type than asked for: an answer of
// that shape is corrupt_data, never an exception into the caller.
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const json::exception& e) {
    return make_status(StatusCode::corrupt_data, "etcd {}: unexpected answer: {}", what, e.what());
  }
}

// The gateway's error: {"error": text, "code": grpc code, "message": text}, or on a
// stream (a lease keep-alive) {"error": {"grpc_code", "http_code", "message", ...}}.
// Any other shape gives the body as the message and no code; never throws.
std::pair<std::string, int> gateway_error(const json& j, const std::string& body) {
  if (!j.is_object()) return {body, 0};
  const auto it = j.find("error");
  const json& e = it != j.end() && it->is_object() ? *it : j;
  std::string msg = body;
  if (const auto m = e.find("message"); m != e.end() && m->is_string()) msg = m->get<std::string>();
  else if (it != j.end() && it->is_string()) msg = it->get<std::string>();
  int grpc = 0;
  for (const char* key : {"code", "grpc_code"})
    if (const auto c = e.find(key); c != e.end() && c->is_number_integer()) grpc = c->get<int>();
  return {msg, grpc};
}

struct Transfer {
  std::string body;
  const CancelToken* cancel = nullptr;
  // Streaming: called per complete line; false stops the transfer.
  std::function<bool(std::string_view)> on_line;
  bool stopped = false;
};

size_t on_data(char* p, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  t->body.append(p, size * n);
  if (t->on_line) {
    size_t nl;
    while ((nl = t->body.find('\n')) != std::string::npos) {
      const std::string line = t->body.substr(0, nl);
      t->body.erase(0, nl + 1);
      if (!line.empty() && !t->on_line(line)) {
        t->stopped = true;
        return 0;  // ends the transfer (CURLE_WRITE_ERROR)
      }
    }
  }
  return size * n;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return t->cancel && t->cancel->cancelled() ? 1 : 0;
}

struct Easy {
  CURL* h = curl_easy_init();
  curl_slist* headers = nullptr;
  ~Easy() {
    if (headers) curl_slist_free_all(headers);
    if (h) curl_easy_cleanup(h);
  }
};

// One POST; `timeout` 0 = none (a watch). Returns the HTTP status, or why no answer.
Result<long> post(const std::string& url, const std::string& body, std::chrono::milliseconds timeout,
                  Transfer& t) {
  Easy e;
  if (!e.h) return make_status(StatusCode::resource_exhausted, "etcd: curl_easy_init failed");
  e.headers = curl_slist_append(nullptr, "Content-Type: application/json");
  // etcd's require-leader metadata (gRPC's "hasleader", through the gateway's
  // Grpc-Metadata- headers): a member cut off from its cluster's majority answers
  // "no leader" at once (the call tries the next endpoint) and cancels a watch after a
  // few election timeouts. Without it a watch there stays open and silent while the
  // others change the member set, and its follower never sees the change.
  e.headers = curl_slist_append(e.headers, "Grpc-Metadata-hasleader: true");
  curl_easy_setopt(e.h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e.h, CURLOPT_HTTPHEADER, e.headers);
  curl_easy_setopt(e.h, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(e.h, CURLOPT_POSTFIELDSIZE, long(body.size()));
  curl_easy_setopt(e.h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(e.h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(e.h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(e.h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(e.h, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(e.h, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM in a host's process
  curl_easy_setopt(e.h, CURLOPT_TIMEOUT_MS, long(timeout.count()));
  curl_easy_setopt(e.h, CURLOPT_CONNECTTIMEOUT_MS, long(timeout.count() ? std::min<int64_t>(timeout.count(), 1000)
                                                                         : 1000));
  // A watch is silent while nothing changes: keepalive probes find a dead etcd.
  curl_easy_setopt(e.h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e.h, CURLOPT_TCP_KEEPIDLE, 2L);
  curl_easy_setopt(e.h, CURLOPT_TCP_KEEPINTVL, 1L);
  const CURLcode rc = curl_easy_perform(e.h);
  if (t.stopped) return 200L;
  if (rc == CURLE_ABORTED_BY_CALLBACK)
    return detail::repeated_status(StatusCode::cancelled, "etcd request cancelled");
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return detail::repeated_status(StatusCode::timed_out, "etcd {}: {}", url, curl_easy_strerror(rc));
  if (rc != CURLE_OK) return detail::repeated_status(StatusCode::unavailable, "etcd {}: {}", url, curl_easy_strerror(rc));
  long code = 0;
  curl_easy_getinfo(e.h, CURLINFO_RESPONSE_CODE, &code);
  return code;
}

}  // namespace

Result<EtcdClient> EtcdClient::create(const EtcdConfig& config) {
  if (config.endpoints.empty()) return make_status(StatusCode::invalid_argument, "etcd: no endpoint given");
  for (const auto& e : config.endpoints)
    if (e.rfind("http://", 0) != 0 && e.rfind("https://", 0) != 0)
      return make_status(StatusCode::invalid_argument, "etcd endpoint '{}' is not an http:// or https:// URL", e);
  if (config.prefix.empty()) return make_status(StatusCode::invalid_argument, "etcd: empty key prefix");
  if (config.lease_ttl < std::chrono::seconds(2))
    return make_status(StatusCode::invalid_argument, "etcd: lease TTL {} s below etcd's minimum of 2 s",
                       config.lease_ttl.count());
  if (config.request_timeout.count() <= 0)
    return make_status(StatusCode::invalid_argument, "etcd: request timeout must be positive");
  if (!curl_ready()) return make_status(StatusCode::internal, "etcd: curl_global_init failed");
  return EtcdClient(config);
}

Result<json> EtcdClient::call(const char* path, const json& body, Deadline deadline, const CancelToken& cancel) {
  const std::string text = body.dump();
  std::string errors;
  Status last;
  const size_t n = cfg_.endpoints.size(), first = preferred_.load() % n;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (first + k) % n;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (cancel.cancelled()) return make_status(StatusCode::cancelled, "etcd {} cancelled", path);
    if (left.count() <= 0) {
      return make_status(StatusCode::timed_out, "etcd {}: deadline passed{}{}", path, errors.empty() ? "" : " after ",
                         errors);
    }
    // The time left is shared by the endpoints not tried yet: a member that takes the
    // connection and never answers (a frozen process) must not use up a lease
    // renewal's whole deadline before a live member is asked.
    const auto share = std::max<std::chrono::milliseconds>(left / long(n - k), std::chrono::milliseconds(1));
    Transfer t;
    t.cancel = &cancel;
    auto code = post(cfg_.endpoints[i] + path, text, std::min(share, cfg_.request_timeout), t);
    if (!code.ok()) {
      if (code.status().code() == StatusCode::cancelled) return make_status(StatusCode::cancelled, "etcd {} cancelled", path);
      last = code.status();
      errors += fmt::format("{}{}", errors.empty() ? "" : "; ", code.status().message());
      // Calls after this one (a lease's next renewal, half a second on) start at the
      // next endpoint, not at the one that did not answer.
      size_t expected = i;
      preferred_.compare_exchange_strong(expected, (i + 1) % n);
      continue;
    }
    json j = json::parse(t.body, nullptr, false);
    if (j.is_discarded())
      return make_status(StatusCode::corrupt_data, "etcd {}{}: the answer is not JSON ({} bytes)", cfg_.endpoints[i],
                         path, t.body.size());
    if (*code != 200) {
      const auto [msg, grpc] = gateway_error(j, t.body);
      // 14 UNAVAILABLE (no leader, stopping): another endpoint may answer.
      if (grpc == 14 || *code >= 500) {
        last = Status(StatusCode::unavailable, msg);
        errors += fmt::format("{}{}: HTTP {}: {}", errors.empty() ? "" : "; ", cfg_.endpoints[i], *code, msg);
        size_t expected = i;
        preferred_.compare_exchange_strong(expected, (i + 1) % n);
        continue;
      }
      const StatusCode c = grpc == 5 ? StatusCode::not_found : grpc == 3 ? StatusCode::invalid_argument
                                                                          : StatusCode::internal;
      return make_status(c, "etcd {}{}: HTTP {}: {}", cfg_.endpoints[i], path, *code, msg);
    }
    preferred_.store(i);
    return j;
  }
  return make_status(last.code() == StatusCode::timed_out ? StatusCode::timed_out : StatusCode::unavailable,
                     "etcd {}: no endpoint answered: {}", path, errors);
}

Result<int64_t> EtcdClient::grant(std::chrono::seconds ttl, Deadline deadline, const CancelToken& cancel) {
  KVS_ASSIGN_OR_RETURN(json j, call("/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}}, deadline, cancel));
  return guarded("lease grant", [&]() -> Result<int64_t> {
    const int64_t id = i64(j, "ID");
    if (id == 0) return make_status(StatusCode::internal, "etcd lease grant: {}", j.value("error", std::string("no ID")));
    return id;
  });
}

Result<int64_t> EtcdClient::keep_alive(int64_t lease, Deadline deadline, const CancelToken& cancel) {
  KVS_ASSIGN_OR_RETURN(json j, call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}, deadline, cancel));
  // One message of the keep-alive stream: {"result": {"ID", "TTL"}}; no TTL = expired.
  return guarded("lease keepalive", [&]() -> Result<int64_t> {
    const json& r = j.contains("result") ? j["result"] : j;
    return i64(r, "TTL");
  });
}

Status EtcdClient::revoke(int64_t lease, Deadline deadline, const CancelToken& cancel) {
  auto j = call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}, deadline, cancel);
  if (!j.ok() && j.status().code() == StatusCode::not_found) return {};  // already gone
  return j.status();
}

Status EtcdClient::put(const std::string& key, const std::string& value, int64_t lease, Deadline deadline,
                       const CancelToken& cancel) {
  json body = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return call("/v3/kv/put", body, deadline, cancel).status();
}

Result<EtcdClient::Range> EtcdClient::range_prefix(const std::string& prefix, Deadline deadline,
                                                   const CancelToken& cancel) {
  KVS_ASSIGN_OR_RETURN(json j, call("/v3/kv/range", {{"key", b64(prefix)}, {"range_end", b64(etcd_prefix_end(prefix))}},
                                    deadline, cancel));
  return guarded("range", [&]() -> Result<Range> {
    Range out;
    out.revision = j.contains("header") ? i64(j["header"], "revision") : 0;
    for (const auto& kv : j.value("kvs", json::array())) {
      KVS_ASSIGN_OR_RETURN(EtcdKv parsed, parse_kv(kv));
      out.kvs.push_back(std::move(parsed));
    }
    return out;
  });
}

Status EtcdClient::watch_prefix(const std::string& prefix, int64_t start_revision, const CancelToken& cancel,
                                const std::function<void(const std::vector<EtcdEvent>&, int64_t)>& on_events) {
  const json req = {{"create_request",
                     {{"key", b64(prefix)},
                      {"range_end", b64(etcd_prefix_end(prefix))},
                      {"start_revision", std::to_string(start_revision)}}}};
  Status verdict = detail::repeated_status(StatusCode::unavailable, "etcd watch of '{}' ended", prefix);
  Transfer t;
  t.cancel = &cancel;
  const auto handle = [&](std::string_view line) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      verdict = make_status(StatusCode::corrupt_data, "etcd watch: a message is not JSON");
      return false;
    }
    if (j.contains("error")) {
      verdict = make_status(StatusCode::unavailable, "etcd watch: {}", j["error"].dump());
      return false;
    }
    const json& r = j.value("result", json::object());
    if (i64(r, "compact_revision") != 0) {
      verdict = Status(StatusCode::out_of_range, fmt::format("etcd watch: revision {} was compacted (now {})",
                                                             start_revision, i64(r, "compact_revision")));
      return false;
    }
    if (r.value("canceled", false)) {
      verdict = make_status(StatusCode::unavailable, "etcd watch cancelled by the server: {}",
                            r.value("cancel_reason", std::string("no reason given")));
      return false;
    }
    std::vector<EtcdEvent> events;
    for (const auto& ev : r.value("events", json::array())) {
      EtcdEvent e;
      e.deleted = ev.value("type", std::string("PUT")) == "DELETE";
      auto kv = parse_kv(ev.value("kv", json::object()));
      if (!kv.ok()) {
        verdict = kv.status();
        return false;
      }
      e.kv = std::move(kv).value();
      events.push_back(std::move(e));
    }
    const int64_t rev = r.contains("header") ? i64(r["header"], "revision") : 0;
    if (!events.empty()) on_events(events, rev);
    return true;
  };
  t.on_line = [&](std::string_view line) {
    Result<bool> r = guarded("watch", [&]() -> Result<bool> { return handle(line); });
    if (!r.ok()) verdict = r.status();
    return r.ok() && *r;
  };
  const size_t i = preferred_.load() % cfg_.endpoints.size();
  auto code = post(cfg_.endpoints[i] + "/v3/watch", req.dump(), std::chrono::milliseconds(0), t);
  if (cancel.cancelled()) return detail::repeated_status(StatusCode::cancelled, "etcd watch cancelled");
  if (t.stopped) return verdict;
  if (!code.ok()) {
    preferred_.store((i + 1) % cfg_.endpoints.size());  // the next attempt tries another endpoint
    return code.status();
  }
  if (*code != 200) return make_status(StatusCode::unavailable, "etcd watch: HTTP {}: {}", *code, t.body);
  return verdict;
}

#else  // !KVSTREAM_HAVE_ETCD

namespace {
Status not_built() {
  return make_status(StatusCode::unsupported,
                     "etcd membership: kvstream was built without libcurl (libcurl4-openssl-dev, KVSTREAM_WITH_ETCD)");
}
}  // namespace

Result<EtcdClient> EtcdClient::create(const EtcdConfig&) { return not_built(); }
Result<nlohmann::json> EtcdClient::call(const char*, const nlohmann::json&, Deadline, const CancelToken&) {
  return not_built();
}
Result<int64_t> EtcdClient::grant(std::chrono::seconds, Deadline, const CancelToken&) { return not_built(); }
Result<int64_t> EtcdClient::keep_alive(int64_t, Deadline, const CancelToken&) { return not_built(); }
Status EtcdClient::revoke(int64_t, Deadline, const CancelToken&) { return not_built(); }
Status EtcdClient::put(const std::string&, const std::string&, int64_t, Deadline, const CancelToken&) {
  return not_built();
}
Result<EtcdClient::Range> EtcdClient::range_prefix(const std::string&, Deadline, const CancelToken&) {
  return not_built();
}
Status EtcdClient::watch_prefix(const std::string&, int64_t, const CancelToken&,
                                const std::function<void(const std::vector<EtcdEvent>&, int64_t)>&) {
  return not_built();
}

#endif  // KVSTREAM_HAVE_ETCD

// ---- The public queries -----------------------------------------------------

Result<std::vector<std::string>> current_members(const EtcdConfig& config, Deadline deadline,
                                                 const CancelToken& cancel) {
  KVS_ASSIGN_OR_RETURN(EtcdClient etcd, EtcdClient::create(config));
  KVS_ASSIGN_OR_RETURN(auto range, etcd.range_prefix(config.prefix + "nodes/", deadline, cancel));
  std::vector<std::string> out;
  for (auto& kv : range.kvs) out.push_back(std::move(kv.value));
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::vector<MigrationReport>> migration_reports(const EtcdConfig& config, Deadline deadline,
                                                       const CancelToken& cancel) {
  KVS_ASSIGN_OR_RETURN(EtcdClient etcd, EtcdClient::create(config));
  KVS_ASSIGN_OR_RETURN(auto range, etcd.range_prefix(config.prefix + "migration/", deadline, cancel));
  std::vector<MigrationReport> out;
  for (const auto& kv : range.kvs) {
    json j = json::parse(kv.value, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return make_status(StatusCode::corrupt_data, "etcd: migration report '{}' is not JSON", kv.key);
    MigrationReport r;
    try {  // a field of the wrong type throws inside nlohmann::json
      r.node = j.value("node", std::string());
      r.members = j.value("members", std::vector<std::string>());
      r.members_revision = j.value("members_revision", int64_t(0));
      r.done = j.value("done", false);
      r.objects_copied = j.value("objects_copied", uint64_t(0));
      r.bytes_copied = j.value("bytes_copied", uint64_t(0));
      r.objects_present = j.value("objects_present", uint64_t(0));
      r.objects_failed = j.value("objects_failed", uint64_t(0));
      r.seconds = j.value("seconds", 0.0);
      // Nodes from before surplus trimming leave these out.
      r.trimmed = j.value("trimmed", false);
      r.objects_trimmed = j.value("objects_trimmed", uint64_t(0));
      r.bytes_trimmed = j.value("bytes_trimmed", uint64_t(0));
      r.objects_kept = j.value("objects_kept", uint64_t(0));
      r.objects_handed_over = j.value("objects_handed_over", uint64_t(0));
      r.bytes_handed_over = j.value("bytes_handed_over", uint64_t(0));
      r.removes_handed_on = j.value("removes_handed_on", uint64_t(0));
      r.removes_complete_since_ms = j.value("removes_complete_since_ms", std::map<std::string, int64_t>());
    } catch (const json::exception& e) {
      return make_status(StatusCode::corrupt_data, "etcd: migration report '{}': {}", kv.key, e.what());
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kvstream::cluster
