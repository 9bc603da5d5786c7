// The C API over KvStore (include/kvstream/c/kvstream.h). Every entry point catches
// everything: a C caller gets a code and kvs_last_error(), never an exception.
#include "kvstream/c/kvstream.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>

#include "core/log.hpp"
#include "kvstream/kv_store.hpp"
#include "kvstream/log.hpp"

using namespace kvstream;

struct kvs_config {
  StoreConfig cfg;
};
struct kvs_store {
  KvStore store;
};
struct kvs_fetch {
  StoreFetch fetch;  // the view it writes into owns its copy of a paged layout
};

namespace {

thread_local std::string g_last_error;

kvs_status fail(const Status& s) {
  g_last_error = s.to_string();
  return static_cast<kvs_status>(s.code());
}
kvs_status fail(StatusCode code, const std::string& message) { return fail(make_status(code, "{}", message)); }

// Runs `fn` (returning Status), turning anything thrown into an error code.
template <typename Fn>
kvs_status guarded(const char* what, Fn&& fn) noexcept {
  try {
    const Status s = fn();
    if (!s.ok()) return fail(s);
    return KVS_OK;
  } catch (const std::bad_alloc&) {
    return fail(StatusCode::resource_exhausted, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(StatusCode::internal, fmt::format("{}: {}", what, e.what()));
  } catch (...) {
    return fail(StatusCode::internal, fmt::format("{}: unknown exception", what));
  }
}

transport::Deadline deadline_after(int64_t timeout_ms) {
  return transport::Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
}

Result<DType> to_dtype(kvs_dtype d) {
  switch (d) {
    case KVS_F32: return DType::f32;
    case KVS_F16: return DType::f16;
    case KVS_BF16: return DType::bf16;
  }
  return make_status(StatusCode::invalid_argument, "unknown kvs_dtype {}", int(d));
}

// The KvView a kvs_kv describes (a paged view keeps its own copy of the pointers and
// the block table).
Result<KvView> to_view(const kvs_kv* kv, const KvGeometry& g) {
  if (!kv) return make_status(StatusCode::invalid_argument, "null KV description");
  KVS_ASSIGN_OR_RETURN(DType dt, to_dtype(kv->dtype));
  if (kv->block_size == 0) {
    if (!kv->base) return make_status(StatusCode::invalid_argument, "packed KV with a null base");
    return KvView::packed(kv->base, dt, g, kv->tokens);
  }
  if (!kv->layer_base || !kv->block_table)
    return make_status(StatusCode::invalid_argument, "paged KV needs layer_base and block_table");
  PagedLayout pl;
  pl.layer_base.assign(kv->layer_base, kv->layer_base + g.layers);
  pl.block_size = kv->block_size;
  const int64_t C = g.channels();
  pl.plane_stride = int64_t(kv->num_blocks) * kv->block_size * C;
  pl.block_stride = int64_t(kv->block_size) * C;
  pl.slot_stride = C;
  pl.num_blocks = kv->num_blocks;
  pl.block_table.assign(kv->block_table, kv->block_table + kv->block_table_len);
  return KvView::paged(std::move(pl), dt, g, kv->tokens);
}

std::span<const Token> token_span(const int32_t* tokens, size_t n) { return {tokens, tokens ? n : 0}; }

/// The put behind kvs_put and kvs_put_ex.
Result<PutReport> put_of(kvs_store* store, const int32_t* tokens, size_t n, const kvs_kv* kv, int64_t timeout_ms) {
  if (!store || (!tokens && n)) return make_status(StatusCode::invalid_argument, "null argument");
  KVS_ASSIGN_OR_RETURN(KvView view, to_view(kv, store->store.geometry()));
  return store->store.put(token_span(tokens, n), view, deadline_after(timeout_ms));
}

}  // namespace

extern "C" {

const char* kvs_last_error(void) { return g_last_error.c_str(); }

void kvs_set_log_callback(kvs_log_fn fn, void* user) {
  if (!fn) {
    kvstream::set_log_sink({});
    return;
  }
  kvstream::set_log_sink([fn, user](kvstream::LogLevel level, std::string_view message) {
    const std::string text(message);  // the C side gets a terminated string
    fn(int(level), text.c_str(), user);
  });
}

const char* kvs_status_name(kvs_status code) {
  if (int(code) < 0 || int(code) > int(kvstream::kLastStatusCode)) return "unknown";
  return status_code_name(static_cast<StatusCode>(code)).data();
}

kvs_config* kvs_config_new(void) { return new (std::nothrow) kvs_config{}; }
void kvs_config_free(kvs_config* config) { delete config; }

kvs_status kvs_config_set(kvs_config* config, const char* name, const char* value) {
  return guarded("kvs_config_set", [&]() -> Status {
    if (!config || !name || !value) return make_status(StatusCode::invalid_argument, "null argument");
    return config->cfg.set(name, value);
  });
}

kvs_status kvs_config_from_env(kvs_config* config) {
  return guarded("kvs_config_from_env", [&]() -> Status {
    if (!config) return make_status(StatusCode::invalid_argument, "null config");
    KVS_ASSIGN_OR_RETURN(config->cfg, StoreConfig::from_env(config->cfg));
    return {};
  });
}

kvs_status kvs_config_describe(const kvs_config* config, char* buf, size_t size, size_t* needed) {
  return guarded("kvs_config_describe", [&]() -> Status {
    if (!config) return make_status(StatusCode::invalid_argument, "null config");
    const std::string d = config->cfg.describe();
    if (needed) *needed = d.size() + 1;
    if (buf && size > 0) {
      const size_t n = std::min(size - 1, d.size());
      std::memcpy(buf, d.data(), n);
      buf[n] = '\0';
    }
    return {};
  });
}

kvs_status kvs_store_open(const kvs_config* config, kvs_store** out) {
  return guarded("kvs_store_open", [&]() -> Status {
    if (!config || !out) return make_status(StatusCode::invalid_argument, "null argument");
    KVS_ASSIGN_OR_RETURN(KvStore store, KvStore::open(config->cfg));
    *out = new kvs_store{std::move(store)};
    return {};
  });
}

void kvs_store_close(kvs_store* store) {
  try {
    delete store;
  } catch (...) {
    // A destructor that throws cannot be reported through a void call; it is logged.
    KVS_LOG_ERROR("kvs_store_close: exception while closing");
  }
}

kvs_status kvs_store_geometry(const kvs_store* store, kvs_geometry* out) {
  return guarded("kvs_store_geometry", [&]() -> Status {
    if (!store || !out) return make_status(StatusCode::invalid_argument, "null argument");
    const KvGeometry& g = store->store.geometry();
    *out = {g.layers, g.kv_heads, g.head_dim, g.planes(), store->store.chunk_tokens()};
    return {};
  });
}

kvs_status kvs_put(kvs_store* store, const int32_t* tokens, size_t n, const kvs_kv* kv, int64_t timeout_ms,
                   kvs_put_report* report) {
  return guarded("kvs_put", [&]() -> Status {
    KVS_ASSIGN_OR_RETURN(PutReport r, put_of(store, tokens, n, kv, timeout_ms));
    if (report) *report = {r.chunks, r.already_stored, r.bytes, r.tokens};
    return {};
  });
}

kvs_status kvs_put_ex(kvs_store* store, const int32_t* tokens, size_t n, const kvs_kv* kv, int64_t timeout_ms,
                      kvs_put_report_ex* report) {
  return guarded("kvs_put_ex", [&]() -> Status {
    KVS_ASSIGN_OR_RETURN(PutReport r, put_of(store, tokens, n, kv, timeout_ms));
    if (report) *report = {{r.chunks, r.already_stored, r.bytes, r.tokens}, r.evicted_chunks, r.evicted_bytes};
    return {};
  });
}

kvs_status kvs_lookup(kvs_store* store, const int32_t* tokens, size_t n, int64_t timeout_ms, uint64_t* out_tokens) {
  return guarded("kvs_lookup", [&]() -> Status {
    if (!store || !out_tokens || (!tokens && n)) return make_status(StatusCode::invalid_argument, "null argument");
    KVS_ASSIGN_OR_RETURN(uint64_t found, store->store.lookup(token_span(tokens, n), deadline_after(timeout_ms)));
    *out_tokens = found;
    return {};
  });
}

kvs_status kvs_fetch_start(kvs_store* store, const int32_t* tokens, size_t n, const kvs_kv* dest, int64_t timeout_ms,
                           int level, kvs_fetch** out) {
  return guarded("kvs_fetch_start", [&]() -> Status {
    if (!store || !out || (!tokens && n)) return make_status(StatusCode::invalid_argument, "null argument");
    auto holder = std::make_unique<kvs_fetch>();
    KVS_ASSIGN_OR_RETURN(KvView view, to_view(dest, store->store.geometry()));
    FetchOptions o;
    if (level >= 0) o.level = uint32_t(level);
    KVS_ASSIGN_OR_RETURN(holder->fetch,
                         store->store.fetch(token_span(tokens, n), {.host = view}, deadline_after(timeout_ms), o));
    *out = holder.release();
    return {};
  });
}

kvs_status kvs_fetch_wait(kvs_fetch* fetch, kvs_fetch_report* report) {
  return guarded("kvs_fetch_wait", [&]() -> Status {
    if (!fetch) return make_status(StatusCode::invalid_argument, "null fetch");
    KVS_ASSIGN_OR_RETURN(FetchReport r, fetch->fetch.wait());
    if (report) {
      uint64_t text = 0;
      for (const auto& range : r.recompute) text += range.size();
      *report = {r.tokens, text, r.bytes, r.mean_quality_loss_pct, r.max_quality_loss_pct};
    }
    return {};
  });
}

void kvs_fetch_cancel(kvs_fetch* fetch) {
  if (fetch) fetch->fetch.cancel();
}

void kvs_fetch_free(kvs_fetch* fetch) {
  try {
    delete fetch;  // cancels and waits when still running
  } catch (...) {
    KVS_LOG_ERROR("kvs_fetch_free: exception while stopping a fetch");
  }
}

kvs_status kvs_remove(kvs_store* store, const int32_t* tokens, size_t n, int64_t timeout_ms, uint32_t* removed) {
  return guarded("kvs_remove", [&]() -> Status {
    if (!store || (!tokens && n)) return make_status(StatusCode::invalid_argument, "null argument");
    KVS_ASSIGN_OR_RETURN(uint32_t r, store->store.remove(token_span(tokens, n), deadline_after(timeout_ms)));
    if (removed) *removed = r;
    return {};
  });
}

kvs_status kvs_evict(kvs_store* store, uint64_t max_bytes, uint64_t max_age_s, int64_t timeout_ms,
                     kvs_evict_report* report) {
  return guarded("kvs_evict", [&]() -> Status {
    if (!store) return make_status(StatusCode::invalid_argument, "null argument");
    if (max_age_s > uint64_t(std::numeric_limits<int64_t>::max()))
      return make_status(StatusCode::invalid_argument, "max_age_s {} is out of range", max_age_s);
    KVS_ASSIGN_OR_RETURN(kvstream::EvictReport r,
                         store->store.evict(max_bytes, std::chrono::seconds(int64_t(max_age_s)),
                                            deadline_after(timeout_ms)));
    if (report) *report = {r.chunks_removed, r.bytes_removed, r.bytes_kept};
    return {};
  });
}

}  // extern "C"
