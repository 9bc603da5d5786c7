// kvstream-bench: shared declarations of its subcommands.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"

namespace kvstream::bench {

/// A subcommand's error exit: `fail(status)` prints "kvstream-bench <what>: <status>"
/// on stderr and returns 1, the exit status.
struct Fail {
  std::string_view what;
  int operator()(const Status& s) const {
    fmt::print(stderr, "kvstream-bench {}: {}\n", what, s.to_string());
    return 1;
  }
};

/// A directory of the benchmark's own under the system's temporary directory
/// (`<name>-<pid>`), made at once and removed with everything in it at the end.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / fmt::format("{}-{}", name, ::getpid())) {
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

/// The value at rank p (0..1) of `v`, nearest rank (0 when empty).
inline double nearest_rank(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

/// Seconds since `t0` on the steady clock.
inline double since(transport::Clock::time_point t0) {
  return std::chrono::duration<double>(transport::Clock::now() - t0).count();
}

struct CodecBenchOptions {
  std::string data;       ///< tinyllama directory ("" = default)
  /// Codec profile files (kvstream-profile output); several compare in one run (a
  /// progressive profile's family is "kvstream", a single-level one's
  /// "kvstream-independent"; a second of a kind is named after its file).
  std::vector<std::string> profiles;
  std::string json, plot; ///< optional outputs
  int windows = 0;        ///< test windows from the second half (0 = all, about 96)
  int train_windows = 48; ///< first-half windows that train static baseline tables
  unsigned threads = 0;   ///< 0 = all cores
  double ppl_bound = 1.0; ///< quality bound for the headline ratios, percent
  bool speed_all = false; ///< time every method (default: kvstream, int8 and fp16)
  bool speed_only = false;///< sizes and speed only, no quality runs
  /// Timed decode passes per method and thread count; the fastest is reported (more
  /// passes filter out a busy neighbour on a shared VM).
  int speed_repeats = 3;
  std::vector<std::string> methods;  ///< families to run (empty = all)
  /// Test windows from this text instead of the eval text's second half (text unlike
  /// the profile's: the drift protocol of perf/README.md); the headline is then by KL.
  std::string text;
  /// Headline bound on the mean KL per scored token (nats); 0: by perplexity
  /// (ppl_bound), unless `text` is set, where it defaults to 0.009.
  double kl_bound = 0;
};
int run_codec_bench(const CodecBenchOptions& o);

struct ClusterClientBenchOptions {
  std::string backend = "tcp";
  std::vector<std::string> nodes;  ///< "host:port" of running storage nodes
  /// own: each node's client on a backend of its own (the anchor); shared: all on one
  /// backend; cluster: the replicated client (replication 1).
  std::string mode = "shared";
  std::string name_space = "bench", secret;
  size_t buffer_mb = 64;  ///< the registered buffer gets land in
};
int run_cluster_client_bench(const ClusterClientBenchOptions& o);

struct StorageBenchOptions {
  std::string backend = "tcp";
  uint32_t clients = 32;
  double seconds = 30;
  uint32_t chunks = 64;
  uint64_t chunk_bytes = 1 << 20;
  std::string json;
  /// Fetch through a Redis Cluster (one of its nodes) instead of a storage node the
  /// bench starts; each client connects with `connections` hiredis connections.
  std::string redis_cluster;
  /// Fetch through one Redis server (host:port) instead of a storage node.
  std::string redis;
  /// Redis (either kind) over TLS, trusting this CA file; a client certificate and
  /// key for tls-auth-clients.
  std::string redis_tls_ca, redis_tls_cert, redis_tls_key;
  /// Redis values sealed at rest under this key file.
  std::string redis_at_rest_key_file;
  /// Times the chunk set is written before the fetches, timed (put throughput).
  uint32_t put_passes = 1;
  /// The node's at-rest key file: its objects are sealed (format 4) and every read
  /// from disk decrypts. Empty: stored in clear.
  std::string at_rest_key_file;
  /// The node's cache of hot chunks in MiB (-1: the node's default, 256). 0 makes
  /// every fetch read (and, with a key file, decrypt) its chunk from the store.
  int64_t cache_mb = -1;
};
int run_storage_bench(const StorageBenchOptions& o);

struct PipelineBenchOptions {
  std::string data;
  std::string geometry = "mistral-7b";
  uint64_t tokens = 9000;
  uint32_t chunk_tokens = 1536;
  uint32_t profile_tokens = 512;      ///< tokens per profile sample chunk (two samples)
  uint32_t max_transform_block = 32;  ///< KLT block cap for the assembled profile
  uint32_t level = 7;
  std::string backend = "tcp";
  std::string server;                 ///< external storage node ("" = in-process on loopback)
  std::string secret = "bench-secret-0123456789";
  uint32_t connections = 1;
  uint32_t depth = 4;
  unsigned decode_threads = 1;
  std::string decode = "cpu";        ///< where chunks decode: cpu, gpu (device memory) or auto
  uint32_t store_reps = 5;           ///< KvStore against the hand-assembled pipeline, alternated (0: skip)
  std::string json;
};
int run_pipeline_bench(const PipelineBenchOptions& o);

struct AdaptBenchOptions {
  std::string data;
  std::string geometry = "mistral-7b";
  uint64_t tokens = 6144;
  uint32_t chunk_tokens = 512;
  uint32_t requests = 200;                 ///< rounds: each configuration once per deadline per round
  std::vector<double> deadlines = {1.0, 0.5};
  double prefill_tokens_per_s = 5000;      ///< the runtime's text prefill rate (see perf/README.md)
  double cap_factor = 2.0;                 ///< a request is cancelled at this multiple of its deadline
  std::string server;                      ///< external node ("" = in-process on loopback)
  std::string secret = "bench-secret-0123456789";
  std::string quality_profile = "build/tinyllama.kvsprofile";  ///< measured ppl increase per level
  std::vector<std::string> configs;        ///< names to run (empty = all)
  uint32_t depth = 4;
  unsigned decode_threads = 1;
  std::string json;
};
int run_adapt_bench(const AdaptBenchOptions& o);

struct TtftBenchOptions {
  std::string data;
  std::vector<std::string> geometries = {"mistral-7b", "llama-70b"};
  std::vector<uint64_t> contexts = {1536, 4096, 9216, 16384};
  std::vector<double> links = {1e9, 3e9, 10e9};  ///< bits per second, paced by the library
  /// GPUs whose text prefill is the baseline (a100, h100; the first is the plot's main
  /// one). Rates per model, derived in perf/README.md: 2 x parameters FLOPs per token at
  /// `prefill_efficiency` of the GPUs' dense fp16 peak (one GPU for 7B, four for 70B).
  std::vector<std::string> prefill_gpus = {"a100", "h100"};
  double prefill_efficiency = 0.5;
  double quality_bound = 1.0;   ///< perplexity increase % kvstream may spend (codec benchmark's bound)
  double int8_quality = 0.011;  ///< the 8-bit baseline's measured ppl increase % (codec benchmark)
  std::string quality_profile = "build/tinyllama.kvsprofile";
  std::string secret = "bench-secret-0123456789";
  uint32_t depth = 4;
  /// Tokens per stored chunk. The text/KV split falls on chunk boundaries, so finer
  /// chunks let a short context be split at all (a one-chunk context is all text or
  /// all KV); 512 costs no measurable rate (a chunk's fixed bytes are ~0.1%).
  uint32_t chunk_tokens = 512;
  unsigned decode_threads = 2;
  std::string json, plot;
};
int run_ttft_bench(const TtftBenchOptions& o);

struct ClientStallBenchOptions {
  std::string backend = "tcp";
  uint32_t connections = 4;   ///< the client's connections to the node
  uint32_t rounds = 20;       ///< idle scene: rounds, each after the node closed the connections
  uint32_t gets = 32;         ///< idle scene: gets per round (distinct chunks)
  uint32_t chunk_kb = 256;    ///< bytes per chunk, KiB
  uint32_t idle_ms = 100;     ///< the node's idle timeout; a round waits three times it
  uint32_t hung_ms = 2000;    ///< hung scene: how long the node's port answers nothing
  uint32_t gap_ms = 5;        ///< hung scene: between two gets
  uint32_t deadline_ms = 200; ///< hung scene: each get's deadline
  std::string json;           ///< optional output
};
int run_client_stall_bench(const ClientStallBenchOptions& o);

struct RemovesBenchOptions {
  uint32_t contexts = 400;  ///< contexts put and removed per round
  uint32_t rounds = 5;      ///< rounds of each kind, alternating
  uint32_t chunk_kb = 4;    ///< one chunk per context, KiB
  uint32_t hand_on = 2000;  ///< removes handed to a node that holds none of them, each way
  std::string dir;          ///< where the nodes' stores go ("": the system's temporary directory)
  std::string json;         ///< optional output
};
int run_removes_bench(const RemovesBenchOptions& o);

struct EvictionBenchOptions {
  std::string data;                  ///< tinyllama directory ("" = default)
  uint32_t prompts = 60;             ///< distinct prompts
  uint32_t shared_chunks = 2;        ///< chunks every prompt starts with (a system prompt)
  uint32_t own_chunks = 3;           ///< chunks of each prompt's own
  uint32_t chunk_tokens = 64;
  uint32_t requests = 600;           ///< each a prompt drawn by popularity (Zipf)
  double zipf = 1.0;                 ///< popularity skew: prompt k is drawn with weight 1 / k^zipf
  double capacity = 0.25;            ///< the store's bound (eviction.max_bytes), a share of all prompts' bytes
  uint32_t scan_chunks = 2000;       ///< chunks stored for the cost of one eviction listing
  uint32_t scan_reps = 5;
  uint64_t seed = 1;
  std::string redis;                 ///< host:port of a Redis server to store in instead of a node started here
  bool redis_cluster = false;        ///< `redis` is a node of a Redis Cluster (its topology learnt from it)
  std::string json;
};
int run_eviction_bench(const EvictionBenchOptions& o);

/// The storage node a benchmark fetches from: the one at `external` (host:port, e.g.
/// across a shaped link), or, when that is empty, one started in this process on
/// loopback storing into `directory` (`cache_bytes` 0: the node's default cache).
/// Namespace "bench" with `secret`; `client` is ready to connect to it.
struct BenchNode {
  std::unique_ptr<storage::Server> server;  ///< null for an external node
  storage::ClientConfig client;
};
Result<BenchNode> open_bench_node(const std::string& external, const std::string& backend, const std::string& secret,
                                  const std::string& directory, uint64_t cache_bytes = 0);

/// One curve of a plot.
struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;
};
/// Writes a PNG with gnuplot (a clear error when gnuplot is not installed).
Status plot_xy(const std::vector<PlotSeries>& series, const std::string& xlabel, const std::string& ylabel,
               bool log_y, const std::string& png);

/// One curve of a panel, drawn with points and lines of this colour ("#rrggbb") and width.
struct PanelSeries {
  PlotSeries data;
  std::string color;
  double width = 1;
  bool dashed = false;
};
/// Text placed just above a point of a panel.
struct PlotLabel {
  double x = 0, y = 0;
  std::string text, color;
};
struct PlotPanel {
  std::string title;
  std::vector<PanelSeries> series;
  std::vector<PlotLabel> labels;
};
/// Writes a PNG of `panels` (gnuplot multiplot, `columns` per row, log-log axes with
/// ticks at the panels' x values); the key is drawn in the first panel only.
Status plot_panels(const std::vector<PlotPanel>& panels, uint32_t columns, const std::string& title,
                   const std::string& xlabel, const std::string& ylabel, const std::string& png);

}  // namespace kvstream::bench
