/* kvstream's C API: the front door (KvStore) for runtimes and languages that bind C.
 *
 * Handles are opaque and owned by the caller: each *_open / *_new / *_start has its
 * *_close / *_free. Every call returns a kvs_status (0 = KVS_OK); an output argument
 * is written only when the call succeeds. kvs_last_error() gives the message of the
 * last failed call on the calling thread. No call aborts the process or lets an
 * exception out. Blocking calls take a timeout in milliseconds; a fetch can be
 * cancelled from any thread.
 *
 *   kvs_config* cfg = kvs_config_new();
 *   kvs_config_set(cfg, "storage.address", "127.0.0.1:7471");
 *   ... codec.profile, codec.model_id, storage.namespace, storage.secret ...
 *   kvs_store* store;
 *   if (kvs_store_open(cfg, &store) != KVS_OK) fprintf(stderr, "%s\n", kvs_last_error());
 *   kvs_put(store, tokens, n, &kv, 10000, NULL);
 *   uint64_t stored; kvs_lookup(store, tokens, n, 1000, &stored);
 *   kvs_fetch* f; kvs_fetch_start(store, tokens, n, &dest, 1000, -1, &f);
 *   kvs_fetch_wait(f, &report); kvs_fetch_free(f);
 *   kvs_store_close(store); kvs_config_free(cfg);
 */
#ifndef KVSTREAM_C_KVSTREAM_H
#define KVSTREAM_C_KVSTREAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: the same numbers as kvstream::StatusCode. */
typedef enum kvs_status {
  KVS_OK = 0,
  KVS_INVALID_ARGUMENT = 1,
  KVS_OUT_OF_RANGE = 2,
  KVS_NOT_FOUND = 3,
  KVS_ALREADY_EXISTS = 4,
  KVS_CORRUPT_DATA = 5,
  KVS_UNSUPPORTED = 6,
  KVS_UNAVAILABLE = 7,
  KVS_TIMED_OUT = 8,
  KVS_CANCELLED = 9,
  KVS_PERMISSION_DENIED = 10,
  KVS_IO_ERROR = 11,
  KVS_RESOURCE_EXHAUSTED = 12,
  KVS_INTERNAL = 13,
  KVS_NO_SPACE = 14 /* no room to store (disk or quota full): remove data, retrying alone does not help */
} kvs_status;

/* Element types of KV memory. */
typedef enum kvs_dtype { KVS_F32 = 0, KVS_F16 = 1, KVS_BF16 = 2 } kvs_dtype;

typedef struct kvs_config kvs_config;
typedef struct kvs_store kvs_store;
typedef struct kvs_fetch kvs_fetch;

/* KV memory in the host, `tokens` tokens starting at position 0 of the prompt.
 * Packed (block_size == 0): `base` is [layer][plane][token][channel].
 * Paged (block_size > 0): vLLM's layout, per layer layer_base[l] is
 * [2][num_blocks][block_size][kv_heads][head_dim]; logical token t lives in block
 * block_table[t / block_size], which must cover every token. */
typedef struct kvs_kv {
  kvs_dtype dtype;
  uint64_t tokens;
  void* base;
  void* const* layer_base;
  uint32_t block_size;
  uint64_t num_blocks;
  const uint32_t* block_table;
  size_t block_table_len;
} kvs_kv;

typedef struct kvs_geometry {
  uint32_t layers, kv_heads, head_dim, planes;
  uint32_t chunk_tokens;
} kvs_geometry;

typedef struct kvs_put_report {
  uint32_t chunks, already_stored;
  uint64_t bytes, tokens;
} kvs_put_report;

/* kvs_put_report and what the put removed to make room (eviction.when_full); a
 * struct of its own so that kvs_put_report keeps its layout for programs built
 * against it. */
typedef struct kvs_put_report_ex {
  kvs_put_report put;
  uint32_t evicted_chunks;
  uint64_t evicted_bytes;
} kvs_put_report_ex;

typedef struct kvs_evict_report {
  uint32_t chunks_removed;
  uint64_t bytes_removed, bytes_kept;
} kvs_evict_report;

typedef struct kvs_fetch_report {
  uint64_t tokens;            /* tokens [0, tokens) in the destination or to recompute */
  uint64_t recompute_tokens;  /* of those, chosen as text: the runtime prefills them */
  uint64_t bytes;
  double mean_quality_loss_pct, max_quality_loss_pct;
} kvs_fetch_report;

/* The message of the last call on this thread that did not return KVS_OK ("" if none).
 * Valid until the next failing call on this thread. */
const char* kvs_last_error(void);
/* Lower-case name of a status code ("not_found"). */
const char* kvs_status_name(kvs_status code);

/* Receives each line kvstream logs: level 0 trace, 1 debug, 2 info, 3 warn, 4 error;
 * the message is valid during the call only. Called from any kvstream thread, one call
 * at a time; it must not call back into kvstream. */
typedef void (*kvs_log_fn)(int level, const char* message, void* user);
/* Sends kvstream's log to `fn` (with `user`) instead of stderr; NULL restores stderr. */
void kvs_set_log_callback(kvs_log_fn fn, void* user);

/* A configuration with every default (see kvs_config_describe). NULL when out of memory. */
kvs_config* kvs_config_new(void);
void kvs_config_free(kvs_config* config);
/* Sets one setting by name ("storage.address"), as text; lists comma-separated. */
kvs_status kvs_config_set(kvs_config* config, const char* name, const char* value);
/* Overrides settings from KVSTREAM_* environment variables. */
kvs_status kvs_config_from_env(kvs_config* config);
/* Writes every setting, its value, default and meaning into buf (NUL-terminated,
 * truncated to size); *needed (optional) gets the full length + 1. */
kvs_status kvs_config_describe(const kvs_config* config, char* buf, size_t size, size_t* needed);

/* Connects and loads the profile; *out is set only on success. */
kvs_status kvs_store_open(const kvs_config* config, kvs_store** out);
/* Waits for nothing: fetches still running hold what they need until freed. */
void kvs_store_close(kvs_store* store);
kvs_status kvs_store_geometry(const kvs_store* store, kvs_geometry* out);

/* Stores the KV of tokens[0, n) (every whole chunk, every level, skipping chunks
 * already stored). `report` may be NULL. */
kvs_status kvs_put(kvs_store* store, const int32_t* tokens, size_t n, const kvs_kv* kv, int64_t timeout_ms,
                   kvs_put_report* report);
/* kvs_put, reporting also what eviction.when_full removed. `report` may be NULL. */
kvs_status kvs_put_ex(kvs_store* store, const int32_t* tokens, size_t n, const kvs_kv* kv, int64_t timeout_ms,
                      kvs_put_report_ex* report);
/* How many leading tokens are stored (whole chunks). */
kvs_status kvs_lookup(kvs_store* store, const int32_t* tokens, size_t n, int64_t timeout_ms, uint64_t* out_tokens);
/* Starts fetching the stored prefix of tokens into dest. level < 0: each chunk's
 * level chosen against the deadline (now + timeout_ms); else that level. */
kvs_status kvs_fetch_start(kvs_store* store, const int32_t* tokens, size_t n, const kvs_kv* dest, int64_t timeout_ms,
                           int level, kvs_fetch** out);
/* Waits for the fetch; `report` may be NULL. Returns the fetch's status. */
kvs_status kvs_fetch_wait(kvs_fetch* fetch, kvs_fetch_report* report);
/* Cancels it (safe from any thread, any time before kvs_fetch_free). */
void kvs_fetch_cancel(kvs_fetch* fetch);
/* Cancels if still running, waits, frees. */
void kvs_fetch_free(kvs_fetch* fetch);
/* Removes the stored chunks of tokens; *removed (optional) gets how many. */
kvs_status kvs_remove(kvs_store* store, const int32_t* tokens, size_t n, int64_t timeout_ms, uint32_t* removed);
/* Removes chunks of this model and profile stored longer ago than max_age_s (0: no
 * bound), then, until at most max_bytes are kept (0: no bound), the deepest chunks
 * first, so what stays is whole prefixes. *report (optional) gets what it did. A store
 * opened with eviction.when_full=true also does this by itself when a put finds no
 * space (KVS_NO_SPACE otherwise). */
kvs_status kvs_evict(kvs_store* store, uint64_t max_bytes, uint64_t max_age_s, int64_t timeout_ms,
                     kvs_evict_report* report);

#ifdef __cplusplus
}
#endif

#endif /* KVSTREAM_C_KVSTREAM_H */
