// kvstream-bench: benchmarks, each measured against an anchor run in the same process.
#include <CLI/CLI.hpp>

#include "perf/bench.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvstream benchmarks"};
  app.require_subcommand(1);
  kvstream::bench::CodecBenchOptions co;
  auto* codec = app.add_subcommand("codec", "rate, quality and speed of the codec and its baselines on tinyllama KV");
  codec->add_option("--data", co.data, "tinyllama data directory (default: $KVSTREAM_TINYLLAMA or ../shared/data/tinyllama)");
  codec->add_option("--profile", co.profiles, "codec profile from kvstream-profile (repeat to compare several)")
      ->required();
  codec->add_option("--json", co.json, "write the rows as JSON");
  codec->add_option("--plot", co.plot, "write a rate/quality PNG (gnuplot)");
  codec->add_option("--windows", co.windows, "test windows from the second half (0: all)");
  codec->add_option("--train-windows", co.train_windows, "first-half windows that train static baseline tables");
  codec->add_option("--threads", co.threads, "threads for quality runs and the multi-thread decode (0: all)");
  codec->add_option("--ppl-bound", co.ppl_bound, "quality bound of the headline ratios (percent)");
  codec->add_option("--methods", co.methods, "families to run: kvstream fp16 int-token kivi zstd-fp16 cachegen-code "
                                             "cachegen-static cachegen-paper (default: all)");
  codec->add_flag("--speed-only", co.speed_only, "sizes and speed only (skips the quality runs)");
  codec->add_option("--text", co.text, "test windows from this text file instead of the eval text (drift protocol)");
  codec->add_option("--kl-bound", co.kl_bound, "headline bound on KL nats per token (default: by perplexity; "
                                               "0.009 with --text)");
  codec->add_flag("--speed-all", co.speed_all, "time every method, not only kvstream, int8 and fp16");
  codec->add_option("--speed-repeats", co.speed_repeats, "timed decode passes per method; the fastest is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  kvstream::bench::StorageBenchOptions so;
  auto* st = app.add_subcommand("storage", "a storage node on loopback under many concurrent clients");
  st->add_option("--backend", so.backend, "tcp, ucx or libfabric")->capture_default_str();
  st->add_option("--clients", so.clients, "concurrent clients")->capture_default_str();
  st->add_option("--seconds", so.seconds, "duration")->capture_default_str();
  st->add_option("--chunks", so.chunks, "distinct chunks stored")->capture_default_str();
  st->add_option("--chunk-bytes", so.chunk_bytes, "bytes per chunk")->capture_default_str();
  st->add_option("--json", so.json, "write the figures as JSON");
  st->add_option("--redis-cluster", so.redis_cluster,
                 "host:port of a Redis Cluster node: the clients fetch from the cluster instead of a storage node");
  st->add_option("--redis", so.redis, "host:port of one Redis server: the clients fetch from it instead");
  st->add_option("--redis-tls-ca", so.redis_tls_ca, "Redis over TLS, trusting this CA file");
  st->add_option("--redis-tls-cert", so.redis_tls_cert, "Redis over TLS: client certificate (tls-auth-clients)");
  st->add_option("--redis-tls-key", so.redis_tls_key, "Redis over TLS: the client certificate's key");
  st->add_option("--redis-at-rest-key-file", so.redis_at_rest_key_file, "Redis values sealed under this key file");
  st->add_option("--put-passes", so.put_passes, "times the chunks are written, timed, before the fetches")
      ->capture_default_str();
  st->add_option("--at-rest-key-file", so.at_rest_key_file, "the node encrypts at rest under this key file");
  st->add_option("--cache-mb", so.cache_mb, "the node's cache of hot chunks (-1: its default; 0: every fetch reads "
                                            "the store)")
      ->capture_default_str();
  kvstream::bench::PipelineBenchOptions po;
  auto* pl = app.add_subcommand("pipeline", "transfer alone, decode alone and the pipelined fetch of one context");
  pl->add_option("--data", po.data, "tinyllama data directory");
  pl->add_option("--geometry", po.geometry, "tinyllama, llama-7b, mistral-7b, llama-70b (assembled from real KV)")
      ->capture_default_str();
  pl->add_option("--tokens", po.tokens, "context length")->capture_default_str();
  pl->add_option("--chunk-tokens", po.chunk_tokens, "tokens per chunk")->capture_default_str();
  pl->add_option("--level", po.level, "compression level of every chunk")->capture_default_str();
  pl->add_option("--backend", po.backend, "tcp, ucx or libfabric")->capture_default_str();
  pl->add_option("--server", po.server, "external storage node host:port (default: one in this process on loopback)");
  pl->add_option("--secret", po.secret, "namespace 'bench' secret of the external node");
  pl->add_option("--connections", po.connections, "client connections")->capture_default_str();
  pl->add_option("--depth", po.depth, "pipeline buffers")->capture_default_str();
  pl->add_option("--store-reps", po.store_reps,
                 "fetches of the whole chunks through KvStore and by hand, alternated (0: skip)")
      ->capture_default_str();
  pl->add_option("--decode-threads", po.decode_threads, "decode threads (on the GPU: decoders, one stream each)")
      ->capture_default_str();
  pl->add_option("--decode", po.decode,
                 "cpu: into host memory; gpu: into device memory (an error without a usable GPU); auto: gpu when "
                 "one is usable, else cpu")
      ->check(CLI::IsMember({"cpu", "gpu", "auto"}))
      ->capture_default_str();
  pl->add_option("--json", po.json, "write the figures as JSON");
  kvstream::bench::AdaptBenchOptions ao;
  auto* ad = app.add_subcommand("adapt", "fixed levels, text, 8-bit and the adaptive choosers on a link whose rate "
                                         "changes (perf/adapt/run.sh drives it)");
  ad->add_option("--data", ao.data, "tinyllama data directory");
  ad->add_option("--geometry", ao.geometry, "tinyllama, llama-7b, mistral-7b, llama-70b (assembled from real KV)")
      ->capture_default_str();
  ad->add_option("--tokens", ao.tokens, "context length")->capture_default_str();
  ad->add_option("--chunk-tokens", ao.chunk_tokens, "tokens per chunk")->capture_default_str();
  ad->add_option("--requests", ao.requests, "requests per configuration and deadline")->capture_default_str();
  ad->add_option("--deadlines", ao.deadlines, "time-to-first-token deadlines (s)")->capture_default_str();
  ad->add_option("--prefill-tokens-per-s", ao.prefill_tokens_per_s, "the runtime's text prefill rate")
      ->capture_default_str();
  ad->add_option("--cap", ao.cap_factor, "cancel a request at this multiple of its deadline")->capture_default_str();
  ad->add_option("--server", ao.server, "storage node host:port (default: one in this process on loopback)");
  ad->add_option("--secret", ao.secret, "namespace 'bench' secret of the node");
  ad->add_option("--quality-profile", ao.quality_profile, "profile with measured ppl increase per level")
      ->capture_default_str();
  ad->add_option("--configs", ao.configs, "configurations to run, by name (default: all)");
  ad->add_option("--depth", ao.depth, "pipeline buffers")->capture_default_str();
  ad->add_option("--decode-threads", ao.decode_threads, "decode threads")->capture_default_str();
  ad->add_option("--json", ao.json, "write rows and every request as JSON");
  kvstream::bench::TtftBenchOptions to;
  auto* tt = app.add_subcommand("ttft", "time to first token: text recompute (the baseline), raw fp16, 8-bit KV, "
                                        "kvstream KV only and kvstream adaptive (a text prefix beside the fetch) over "
                                        "a paced link");
  tt->add_option("--data", to.data, "tinyllama data directory");
  tt->add_option("--geometries", to.geometries, "mistral-7b, llama-70b, ... (assembled from real KV)")
      ->capture_default_str();
  tt->add_option("--contexts", to.contexts, "context lengths in tokens")->capture_default_str();
  tt->add_option("--links", to.links, "link rates in bits/s (paced by the library)")->capture_default_str();
  tt->add_option("--prefill-gpus", to.prefill_gpus, "GPUs whose text prefill is the baseline: a100, h100 (the first "
                                                    "is the plot's main one)")
      ->check(CLI::IsMember({"a100", "h100"}))
      ->capture_default_str();
  tt->add_option("--prefill-efficiency", to.prefill_efficiency,
                 "fraction of the GPUs' dense fp16 peak that prefill reaches (perf/README.md)")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  tt->add_option("--quality-bound", to.quality_bound, "ppl increase % kvstream may spend")->capture_default_str();
  tt->add_option("--quality-profile", to.quality_profile, "profile with measured ppl increase per level")
      ->capture_default_str();
  tt->add_option("--decode-threads", to.decode_threads, "decode threads")->capture_default_str();
  tt->add_option("--chunk-tokens", to.chunk_tokens, "tokens per stored chunk (the text/KV split falls between chunks)")
      ->capture_default_str();
  tt->add_option("--json", to.json, "write the rows as JSON");
  tt->add_option("--plot", to.plot, "write TTFT against context length (PNG, gnuplot)");
  kvstream::bench::ClusterClientBenchOptions cco;
  auto* cc = app.add_subcommand("cluster-client", "what a client of several storage nodes costs: a backend per node "
                                                  "(anchor), one shared backend, the replicated client");
  cc->add_option("--backend", cco.backend, "tcp, ucx or libfabric")->capture_default_str();
  cc->add_option("--node", cco.nodes, "a running storage node, host:port (repeat)")->required();
  cc->add_option("--mode", cco.mode, "own, shared or cluster")->capture_default_str();
  cc->add_option("--namespace", cco.name_space, "namespace on the nodes")->capture_default_str();
  cc->add_option("--secret", cco.secret, "its secret")->required();
  cc->add_option("--buffer-mb", cco.buffer_mb, "registered buffer the gets land in, MiB")->capture_default_str();
  kvstream::bench::EvictionBenchOptions eo;
  auto* ev = app.add_subcommand("eviction", "prefix hits of a bounded store under a skewed workload, evicting by use "
                                            "against the deepest-then-oldest order (anchor), and what one eviction "
                                            "listing costs");
  ev->add_option("--data", eo.data, "tinyllama data directory");
  ev->add_option("--prompts", eo.prompts, "distinct prompts")->capture_default_str();
  ev->add_option("--shared-chunks", eo.shared_chunks, "chunks every prompt starts with")->capture_default_str();
  ev->add_option("--own-chunks", eo.own_chunks, "chunks of each prompt's own")->capture_default_str();
  ev->add_option("--chunk-tokens", eo.chunk_tokens, "tokens per chunk")->capture_default_str();
  ev->add_option("--requests", eo.requests, "requests, each a prompt drawn by popularity")->capture_default_str();
  ev->add_option("--zipf", eo.zipf, "popularity skew (weight 1/k^s)")->capture_default_str();
  ev->add_option("--capacity", eo.capacity, "store bound as a share of all prompts' bytes")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  ev->add_option("--scan-chunks", eo.scan_chunks, "chunks stored for the listing cost (0: skip)")->capture_default_str();
  ev->add_option("--scan-reps", eo.scan_reps, "timed listings per order")->capture_default_str();
  ev->add_option("--seed", eo.seed, "request sequence seed")->capture_default_str();
  ev->add_option("--redis", eo.redis, "host:port of a Redis server to store in (namespaces of the run's own)");
  ev->add_flag("--redis-cluster", eo.redis_cluster, "--redis names a node of a Redis Cluster");
  ev->add_option("--json", eo.json, "write the figures as JSON");
  kvstream::bench::ClientStallBenchOptions cso;
  auto* cs = app.add_subcommand("client-stall", "time a scheduler thread spends inside the node client's "
                                                "asynchronous gets while the client connects again");
  cs->add_option("--backend", cso.backend, "tcp, ucx or libfabric")->capture_default_str();
  cs->add_option("--connections", cso.connections, "the client's connections")->capture_default_str();
  cs->add_option("--rounds", cso.rounds, "idle scene: rounds")->capture_default_str();
  cs->add_option("--gets", cso.gets, "idle scene: gets per round")->capture_default_str();
  cs->add_option("--chunk-kb", cso.chunk_kb, "bytes per chunk, KiB")->capture_default_str();
  cs->add_option("--idle-ms", cso.idle_ms, "the node's idle timeout, ms")->capture_default_str();
  cs->add_option("--hung-ms", cso.hung_ms, "hung scene: how long the node answers nothing, ms")->capture_default_str();
  cs->add_option("--gap-ms", cso.gap_ms, "hung scene: between two gets, ms")->capture_default_str();
  cs->add_option("--deadline-ms", cso.deadline_ms, "hung scene: each get's deadline, ms")->capture_default_str();
  cs->add_option("--json", cso.json, "write the figures as JSON");
  kvstream::bench::RemovesBenchOptions ro;
  auto* rm = app.add_subcommand("removes", "what a storage node's remembered removes cost a remove, against a node "
                                           "that remembers none (anchor), and the older copies each takes back");
  rm->add_option("--contexts", ro.contexts, "contexts put and removed per round")->capture_default_str();
  rm->add_option("--rounds", ro.rounds, "rounds of each kind, alternating")->capture_default_str();
  rm->add_option("--chunk-kb", ro.chunk_kb, "bytes of each context's one chunk, KiB")->capture_default_str();
  rm->add_option("--hand-on", ro.hand_on, "removes handed to a node that holds none of them, one request each and "
                                          "in batches")
      ->capture_default_str();
  rm->add_option("--dir", ro.dir, "where the nodes' stores go (default: the system's temporary directory)");
  rm->add_option("--json", ro.json, "write the figures as JSON");
  CLI11_PARSE(app, argc, argv);
  if (*rm) return kvstream::bench::run_removes_bench(ro);
  if (*cs) return kvstream::bench::run_client_stall_bench(cso);
  if (*ev) return kvstream::bench::run_eviction_bench(eo);
  if (*cc) return kvstream::bench::run_cluster_client_bench(cco);
  if (*tt) return kvstream::bench::run_ttft_bench(to);
  if (*ad) return kvstream::bench::run_adapt_bench(ao);
  if (*pl) return kvstream::bench::run_pipeline_bench(po);
  if (*codec) return kvstream::bench::run_codec_bench(co);
  if (*st) return kvstream::bench::run_storage_bench(so);
  return 0;
}
