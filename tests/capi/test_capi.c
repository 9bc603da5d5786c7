/* The C API from a C program: a kvstream-server process it starts on a free loopback
 * port (and stops by PID), then config, open, put, lookup of full and partial
 * prefixes, fetch into packed and paged memory (equal bit for bit, close to what was
 * put), errors with codes and messages, outputs untouched on failure, cancel.
 *
 * usage: test_capi <kvstream-server> <codec profile>   (exit 0 = pass, 77 = skip) */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvstream/c/kvstream.h"

static int failures = 0;
#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                        \
    }                                                                    \
  } while (0)
#define CHECK_OK(call)                                                                     \
  do {                                                                                     \
    kvs_status s_ = (call);                                                                \
    if (s_ != KVS_OK) {                                                                    \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, kvs_status_name(s_), \
              kvs_last_error());                                                           \
      ++failures;                                                                          \
    }                                                                                      \
  } while (0)

static pid_t server_pid = -1;

/* Starts kvstream-server on 127.0.0.1:0 and reads the address it prints. */
static int start_server(const char* bin, const char* dir, char* address, size_t size) {
  char secrets[512];
  snprintf(secrets, sizeof secrets, "%s/secrets.json", dir);
  FILE* f = fopen(secrets, "w");
  if (!f) return -1;
  fputs("{\"capi\": \"capi-secret-0123456789\"}\n", f);
  fclose(f);
  char store[512];
  snprintf(store, sizeof store, "%s/node", dir);
  int out[2];
  if (pipe(out) != 0) return -1;
  server_pid = fork();
  if (server_pid < 0) return -1;
  if (server_pid == 0) {
    /* The server goes when this test does, even when the test crashes: an orphan
     * would hold ctest's output pipe open until the timeout. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    /* 1 MiB for the tenant: the store opened with eviction.when_full below fills it. */
    execl(bin, bin, "--listen", "127.0.0.1:0", "--dir", store, "--secrets", secrets, "--namespace-quota-mb", "1",
          (char*)NULL);
    _exit(127);
  }
  close(out[1]);
  FILE* r = fdopen(out[0], "r");
  char line[256];
  int ok = -1;
  while (r && fgets(line, sizeof line, r)) {
    if (strncmp(line, "listening on ", 13) == 0) {
      line[strcspn(line, "\n")] = 0;
      snprintf(address, size, "%s", line + 13);
      ok = 0;
      break;
    }
  }
  /* The pipe stays open (the server's later output goes nowhere we read). */
  return ok;
}

static void stop_server(void) {
  if (server_pid > 0) {
    kill(server_pid, SIGTERM);
    waitpid(server_pid, NULL, 0);
    server_pid = -1;
  }
}

/* The host's log callback: counts lines and checks each is a terminated string. */
static int log_lines = 0, log_bad = 0;
static void on_log(int level, const char* message, void* user) {
  if (level < 0 || level > 4 || message == NULL || user != &log_lines) ++log_bad;
  ++log_lines;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s <kvstream-server> <codec profile>\n", argv[0]);
    return 2;
  }
  if (access(argv[2], R_OK) != 0) {
    fprintf(stderr, "no codec profile at %s: skipped\n", argv[2]);
    return 77;
  }
  char dir[] = "/tmp/kvstream-capi-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  char address[128] = "";
  if (start_server(argv[1], dir, address, sizeof address) != 0) {
    fprintf(stderr, "could not start %s\n", argv[1]);
    stop_server();
    return 1;
  }

  kvs_set_log_callback(on_log, &log_lines);

  /* Every code has its name; one past the last has none. */
  CHECK(strcmp(kvs_status_name(KVS_NO_SPACE), "no_space") == 0);
  CHECK(strcmp(kvs_status_name(KVS_INTERNAL), "internal") == 0);
  CHECK(strcmp(kvs_status_name((kvs_status)(KVS_NO_SPACE + 1)), "unknown") == 0);

  /* Configuration: errors name what is wrong. */
  kvs_config* cfg = kvs_config_new();
  CHECK(cfg != NULL);
  CHECK(kvs_config_set(cfg, "no.such.setting", "1") == KVS_NOT_FOUND);
  CHECK(strstr(kvs_last_error(), "no.such.setting") != NULL);
  CHECK(kvs_config_set(cfg, "codec.chunk_tokens", "many") == KVS_INVALID_ARGUMENT);
  CHECK_OK(kvs_config_set(cfg, "storage.address", address));
  CHECK_OK(kvs_config_set(cfg, "storage.namespace", "capi"));
  CHECK_OK(kvs_config_set(cfg, "codec.profile", argv[2]));
  CHECK_OK(kvs_config_set(cfg, "codec.model_id", "stories260K"));
  CHECK_OK(kvs_config_set(cfg, "codec.chunk_tokens", "64"));
  size_t needed = 0;
  CHECK_OK(kvs_config_describe(cfg, NULL, 0, &needed));
  char* text = malloc(needed);
  CHECK_OK(kvs_config_describe(cfg, text, needed, NULL));
  CHECK(strstr(text, "codec.chunk_tokens = 64") != NULL);
  free(text);

  /* A wrong secret is refused, and the output is left as it was. */
  kvs_store* store = NULL;
  CHECK_OK(kvs_config_set(cfg, "storage.secret", "not-the-secret-at-all"));
  CHECK(kvs_store_open(cfg, &store) == KVS_PERMISSION_DENIED);
  CHECK(store == NULL);
  CHECK_OK(kvs_config_set(cfg, "storage.secret", "capi-secret-0123456789"));
  CHECK_OK(kvs_store_open(cfg, &store));
  if (!store) {
    stop_server();
    return 1;
  }
  kvs_geometry g;
  CHECK_OK(kvs_store_geometry(store, &g));
  CHECK(g.chunk_tokens == 64 && g.planes == 2 && g.layers > 0);

  /* 200 tokens of smooth KV: 3 whole chunks are stored, the 8-token tail is not. */
  enum { T = 200 };
  const size_t C = (size_t)g.kv_heads * g.head_dim;
  const size_t elems = (size_t)g.layers * 2 * T * C;
  float* kv = malloc(elems * sizeof(float));
  for (size_t i = 0; i < elems; ++i) kv[i] = (float)(0.5 * sin(0.01 * (double)i) + 0.1 * cos(0.37 * (double)(i % 97)));
  int32_t tokens[T];
  for (int t = 0; t < T; ++t) tokens[t] = 1 + (t * 37) % 500;
  kvs_kv src = {KVS_F32, T, kv, NULL, 0, 0, NULL, 0};
  kvs_put_report put;
  CHECK_OK(kvs_put(store, tokens, T, &src, 30000, &put));
  CHECK(put.chunks == 3 && put.already_stored == 0 && put.tokens == 192 && put.bytes > 0);
  CHECK_OK(kvs_put(store, tokens, T, &src, 30000, &put));
  CHECK(put.already_stored == 3 && put.bytes == 0);

  uint64_t found = 12345;
  CHECK_OK(kvs_lookup(store, tokens, T, 5000, &found));
  CHECK(found == 192);
  CHECK_OK(kvs_lookup(store, tokens, 100, 5000, &found));
  CHECK(found == 64);
  int32_t other[T];
  memcpy(other, tokens, sizeof other);
  other[70] += 1; /* chunk 1 differs: only chunk 0 matches */
  CHECK_OK(kvs_lookup(store, other, T, 5000, &found));
  CHECK(found == 64);

  /* Fetch at level 0 into packed f32; close to what was put. */
  float* packed = calloc(elems, sizeof(float));
  kvs_kv dst = {KVS_F32, T, packed, NULL, 0, 0, NULL, 0};
  kvs_fetch* f = NULL;
  CHECK_OK(kvs_fetch_start(store, tokens, T, &dst, 30000, 0, &f));
  kvs_fetch_report rep;
  CHECK_OK(kvs_fetch_wait(f, &rep));
  kvs_fetch_free(f);
  CHECK(rep.tokens == 192 && rep.recompute_tokens == 0 && rep.bytes > 0);
  double err = 0, mag = 0;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (size_t t = 0; t < 192; ++t)
        for (size_t c = 0; c < C; ++c) {
          const size_t i = (((size_t)l * 2 + p) * T + t) * C + c;
          err += fabs((double)packed[i] - kv[i]);
          mag += fabs((double)kv[i]);
        }
  CHECK(mag > 0 && err / mag < 0.1);

  /* The same into paged memory (vLLM's layout, blocks of 16 in reverse order):
   * equal to the packed fetch bit for bit. */
  enum { B = 16, NB = 16 };
  void** layers = malloc(g.layers * sizeof(void*));
  for (uint32_t l = 0; l < g.layers; ++l) layers[l] = calloc((size_t)2 * NB * B * C, sizeof(float));
  uint32_t table[192 / B];
  for (int b = 0; b < 192 / B; ++b) table[b] = NB - 1 - b;
  kvs_kv paged = {KVS_F32, 192, NULL, layers, B, NB, table, 192 / B};
  CHECK_OK(kvs_fetch_start(store, tokens, T, &paged, 30000, 0, &f));
  CHECK_OK(kvs_fetch_wait(f, NULL));
  kvs_fetch_free(f);
  int same = 1;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (size_t t = 0; t < 192; ++t) {
        const float* a = packed + (((size_t)l * 2 + p) * T + t) * C;
        const float* b = (const float*)layers[l] + (((size_t)p * NB + table[t / B]) * B + t % B) * C;
        same = same && memcmp(a, b, C * sizeof(float)) == 0;
      }
  CHECK(same);

  /* The adaptive fetch (level -1) and a cancelled one. */
  f = NULL;
  CHECK_OK(kvs_fetch_start(store, tokens, T, &dst, 30000, -1, &f));
  if (f) {
    CHECK_OK(kvs_fetch_wait(f, &rep));
    CHECK(rep.tokens == 192 && rep.max_quality_loss_pct <= 1.0);
    kvs_fetch_free(f);
  }
  f = NULL;
  CHECK_OK(kvs_fetch_start(store, tokens, T, &dst, 30000, 0, &f));
  if (f) {
    kvs_fetch_cancel(f);
    kvs_status cs = kvs_fetch_wait(f, NULL);
    CHECK(cs == KVS_OK || cs == KVS_CANCELLED);
    kvs_fetch_free(f);
  }
  f = NULL;

  /* Errors: nothing stored, a destination too small, bad arguments; *out untouched. */
  int32_t unknown[64];
  for (int t = 0; t < 64; ++t) unknown[t] = 500 - t;
  f = NULL;
  CHECK(kvs_fetch_start(store, unknown, 64, &dst, 5000, 0, &f) == KVS_NOT_FOUND);
  CHECK(f == NULL);
  kvs_kv small = {KVS_F32, 10, packed, NULL, 0, 0, NULL, 0};
  CHECK(kvs_fetch_start(store, tokens, T, &small, 5000, 0, &f) == KVS_INVALID_ARGUMENT);
  CHECK(f == NULL && strlen(kvs_last_error()) > 0);
  CHECK(kvs_lookup(store, tokens, T, 5000, NULL) == KVS_INVALID_ARGUMENT);
  CHECK(kvs_put(NULL, tokens, T, &src, 5000, NULL) == KVS_INVALID_ARGUMENT);

  /* Nothing is older than an hour, and with no size bound nothing goes. */
  kvs_evict_report ev = {99, 99, 0};
  CHECK_OK(kvs_evict(store, 0, 3600, 5000, &ev));
  CHECK(ev.chunks_removed == 0 && ev.bytes_removed == 0 && ev.bytes_kept > 0);
  CHECK(kvs_evict(NULL, 0, 0, 5000, &ev) == KVS_INVALID_ARGUMENT);

  uint32_t removed = 0;
  CHECK_OK(kvs_remove(store, tokens, T, 5000, &removed));
  CHECK(removed == 3);
  CHECK_OK(kvs_lookup(store, tokens, T, 5000, &found));
  CHECK(found == 0);
  /* Stored again, a size bound of 1 byte removes all three chunks. */
  CHECK_OK(kvs_put(store, tokens, T, &src, 30000, NULL));
  CHECK_OK(kvs_evict(store, 1, 0, 5000, &ev));
  CHECK(ev.chunks_removed == 3 && ev.bytes_kept == 0);
  CHECK_OK(kvs_lookup(store, tokens, T, 5000, &found));
  CHECK(found == 0);

  /* A store that makes room: new prompts until the tenant's 1 MiB is full and a put
   * removes older chunks to fit; kvs_put_ex reports them. Without when_full that put
   * is refused with KVS_NO_SPACE. */
  kvs_store_close(store);
  store = NULL;
  CHECK_OK(kvs_config_set(cfg, "eviction.when_full", "true"));
  CHECK_OK(kvs_store_open(cfg, &store));
  kvs_put_report_ex px;
  memset(&px, 0, sizeof px);
  int puts = 0;
  for (; store && puts < 2000 && px.evicted_chunks == 0; ++puts) {
    for (int t = 0; t < T; ++t) tokens[t] = 1 + (t * 37 + puts * 11 + 1) % 500;
    tokens[0] = 1000 + puts; /* every prompt differs from its first chunk on */
    CHECK_OK(kvs_put_ex(store, tokens, T, &src, 30000, &px));
  }
  CHECK(px.evicted_chunks > 0 && px.evicted_bytes > 0);
  CHECK(px.put.chunks == 3 && px.put.already_stored == 0);
  CHECK_OK(kvs_lookup(store, tokens, T, 5000, &found));
  CHECK(found == 192); /* the prompt that made room is whole */
  CHECK(kvs_put_ex(NULL, tokens, T, &src, 5000, &px) == KVS_INVALID_ARGUMENT);
  printf("put %d found the tenant full and removed %u chunks (%llu bytes)\n", puts, px.evicted_chunks,
         (unsigned long long)px.evicted_bytes);

  kvs_store_close(store);
  kvs_config_free(cfg);
  /* Opening the store logs its transport at info level: the callback saw it. */
  CHECK(log_lines > 0 && log_bad == 0);
  kvs_set_log_callback(NULL, NULL);
  for (uint32_t l = 0; l < g.layers; ++l) free(layers[l]);
  free(layers);
  free(kv);
  free(packed);
  stop_server();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("capi ok\n");
  return 0;
}
