// kvstream-perf: point-to-point transport benchmark in the tradition of ucx_perftest
// and nixlbench. One side runs --server, the other --client HOST; the client sweeps
// block sizes, keeps `batch` messages in flight per iteration, and reports bandwidth
// and latency percentiles per block size.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvstream/transport.hpp"

using namespace kvstream;
using namespace kvstream::transport;
using namespace std::chrono_literals;

namespace {

constexpr uint16_t kDefaultPort = 7472;
// One token for every call (a CancelToken allocates its flag: not per message).
const CancelToken kNoCancel;

// Control header of every message: what it is and, for a read request, what to send.
struct Ctl {
  uint32_t op;  // 1 write (body follows), 2 ack, 3 read request, 4 read data, 5 done,
                // 6 expose request (answered by the node's RemoteRegion, for get)
  uint32_t batch;
  uint64_t block;
};
std::span<const std::byte> as_bytes(const Ctl& c) { return {reinterpret_cast<const std::byte*>(&c), sizeof c}; }

struct Options {
  bool server = false;
  std::string client;
  uint16_t port = kDefaultPort;
  BackendConfig backend;
  uint64_t min_block = 4096, max_block = uint64_t(64) << 20, only_block = 0;
  uint32_t batch = 16, iterations = 0, warmup = 0;
  std::string mode = "write";
  std::string json;
  double seconds_per_size = 1.0;
};

int fail(const Status& s) {
  fmt::print(stderr, "kvstream-perf: {}\n", s.to_string());
  return 1;
}

// Receives posted ahead of the messages they are for (a rendezvous transport lands
// each body on arrival, as ucx_perftest's pre-posted receives do). Every post uses
// the same buffer: a benchmark does not look at what it received. Not when every
// body fits in a header message (UCX sends those inline, and a post would only be
// withdrawn again).
constexpr int kPostAhead = 32;

Status serve_one(Backend& b, Connection& c, std::vector<std::byte>& buf, const MemoryRegion& mr) {
  std::vector<std::byte> h;
  uint32_t in_batch = 0;  // write messages of the current batch received so far
  const bool post_ahead = buf.size() > kMaxHeaderBytes;
  if (post_ahead)
    for (int i = 0; i < kPostAhead; ++i) KVS_RETURN_IF_ERROR(c.post_recv(mr.span(0, buf.size())));
  for (;;) {
    // One deadline per message, for its receive and its reply: a clock read costs
    // ~25 ns on a VM, a tenth of a shared-memory round trip.
    const Deadline dl = deadline_in(60s);
    KVS_ASSIGN_OR_RETURN(size_t len, c.recv_header(h, dl, kNoCancel));
    if (post_ahead) KVS_RETURN_IF_ERROR(c.post_recv(mr.span(0, buf.size())));
    if (h.size() != sizeof(Ctl)) return make_status(StatusCode::corrupt_data, "bad control header");
    Ctl ctl;
    std::memcpy(&ctl, h.data(), sizeof ctl);
    if (len > buf.size()) return make_status(StatusCode::out_of_range, "message of {} bytes", len);
    if (len) KVS_RETURN_IF_ERROR(c.recv_body(mr.span(0, buf.size()), dl, kNoCancel));
    if (ctl.op == 5) return {};
    if (ctl.op == 1) {
      // One ack per batch (after its last message), as ucx_perftest's tag_bw streams
      // without per-message replies; with batch 1 every message is a round trip.
      if (ctl.batch == 0 || ctl.batch > 4096) return make_status(StatusCode::out_of_range, "write batch");
      if (++in_batch < ctl.batch) continue;
      in_batch = 0;
      Ctl ack{2, ctl.batch, len};
      KVS_RETURN_IF_ERROR(c.send(as_bytes(ack), {}, dl, kNoCancel));
    } else if (ctl.op == 3) {
      if (ctl.block > buf.size() || ctl.batch > 4096) return make_status(StatusCode::out_of_range, "read request");
      // The whole batch in flight at once; the body buffer is reused by every
      // message, which is fine for a benchmark (its content is not checked).
      uint64_t last = 0;
      for (uint32_t i = 0; i < ctl.batch; ++i) {
        Ctl data{4, ctl.batch, ctl.block};
        KVS_ASSIGN_OR_RETURN(last, c.post_send(as_bytes(data), mr.span(0, ctl.block)));
      }
      KVS_RETURN_IF_ERROR(c.wait_sends(last, dl, kNoCancel));
    } else if (ctl.op == 6) {
      // Exposed once; the client's gets then read it one-sidedly, without us.
      KVS_ASSIGN_OR_RETURN(RemoteRegion region, mr.expose());
      KVS_RETURN_IF_ERROR(c.send(encode_remote(region), {}, dl, kNoCancel));
    } else {
      return make_status(StatusCode::corrupt_data, "unexpected op {}", ctl.op);
    }
  }
  (void)b;
}

int run_server(const Options& o) {
  auto b = create_backend(o.backend);
  if (!b.ok()) return fail(b.status());
  auto l = (*b)->listen(fmt::format("{}:{}", o.client.empty() ? "127.0.0.1" : o.client, o.port));
  if (!l.ok()) return fail(l.status());
  fmt::print("kvstream-perf server on {} ({})\n", (*l)->address(), (*b)->capabilities().provider);
  std::fflush(stdout);
  std::vector<std::byte> buf(o.max_block);
  auto mr = (*b)->register_memory(buf.data(), buf.size(), MemoryType::host);
  if (!mr.ok()) return fail(mr.status());
  for (;;) {
    auto c = (*l)->accept(deadline_in(3600s), {});
    if (!c.ok()) return fail(c.status());
    if (Status s = serve_one(**b, **c, buf, *mr); !s.ok()) fmt::print(stderr, "session ended: {}\n", s.to_string());
    else return 0;  // the client said done
  }
}

struct Row {
  uint64_t block;
  uint32_t batch;
  double bytes_per_s, avg, p50, p99, p999;
};

int run_client(const Options& o) {
  auto b = create_backend(o.backend);
  if (!b.ok()) return fail(b.status());
  // A server started just before may not listen yet: retry a refused connect for up
  // to 10 s, as a perf run's two sides are usually launched together.
  const std::string address = fmt::format("{}:{}", o.client, o.port);
  const Deadline connect_by = deadline_in(10s);
  auto c = (*b)->connect(address, connect_by, {});
  while (!c.ok() && c.status().code() == StatusCode::unavailable && Clock::now() + 100ms < connect_by) {
    std::this_thread::sleep_for(100ms);
    c = (*b)->connect(address, connect_by, {});
  }
  if (!c.ok()) return fail(c.status());
  fmt::print("# {} {} batch {}\n", (*c)->describe(), o.mode, o.batch);
  std::vector<std::byte> buf(o.max_block);
  std::memset(buf.data(), 0x5a, buf.size());  // touch every page before timing
  auto mr = (*b)->register_memory(buf.data(), buf.size(), MemoryType::host);
  if (!mr.ok()) return fail(mr.status());
  std::vector<uint64_t> sizes;
  if (o.only_block) sizes.push_back(o.only_block);
  else
    for (uint64_t s = o.min_block; s <= o.max_block; s *= 4) sizes.push_back(s);
  fmt::print("{:>12} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "block", "batch", "GB/s", "avg us", "p50 us",
             "p99 us", "p999 us");
  std::vector<Row> rows;
  std::vector<std::byte> h;
  RemoteRegion remote;
  if (o.mode == "get") {
    if (!(*b)->capabilities().one_sided_read)
      return fail(make_status(StatusCode::unsupported, "--mode get: backend {} has no one-sided reads",
                              (*b)->capabilities().backend));
    Ctl ask{6, 0, 0};
    if (Status s = (*c)->send(as_bytes(ask), {}, deadline_in(10s), kNoCancel); !s.ok()) return fail(s);
    auto len = (*c)->recv_header(h, deadline_in(10s), kNoCancel);
    if (!len.ok()) return fail(len.status());
    auto r = decode_remote(h);
    if (!r.ok()) return fail(r.status());
    remote = std::move(r).value();
  }
  for (uint64_t block : sizes) {
    // `dl`: one deadline for the whole batch (taken from the timing clock read).
    auto one_batch = [&](Deadline dl) -> Status {
      if (o.mode == "write") {
        uint64_t last = 0;
        for (uint32_t i = 0; i < o.batch; ++i) {
          Ctl w{1, o.batch, block};
          KVS_ASSIGN_OR_RETURN(last, (*c)->post_send(as_bytes(w), mr->span(0, block)));
        }
        KVS_RETURN_IF_ERROR((*c)->wait_sends(last, dl, kNoCancel));
        // The node acks the batch once, after its last message.
        KVS_ASSIGN_OR_RETURN(size_t len, (*c)->recv_header(h, dl, kNoCancel));
        if (len) KVS_RETURN_IF_ERROR((*c)->recv_body({}, dl, kNoCancel));  // acks have none
      } else if (o.mode == "get") {
        // One-sided: each read lands before the next is posted (Connection::read
        // blocks), so a batch is `batch` reads back to back.
        if (block > remote.size) return make_status(StatusCode::out_of_range, "block larger than the node's buffer");
        for (uint32_t i = 0; i < o.batch; ++i)
          KVS_RETURN_IF_ERROR((*c)->read(mr->span(0, block), remote, 0, dl, kNoCancel));
      } else {
        Ctl r{3, o.batch, block};
        for (uint32_t i = 0; i < o.batch; ++i) KVS_RETURN_IF_ERROR((*c)->post_recv(mr->span(0, block)));
        KVS_RETURN_IF_ERROR((*c)->send(as_bytes(r), {}, dl, kNoCancel));
        for (uint32_t i = 0; i < o.batch; ++i) {
          KVS_ASSIGN_OR_RETURN(size_t len, (*c)->recv_header(h, dl, kNoCancel));
          KVS_RETURN_IF_ERROR((*c)->recv_body(mr->span(0, block), dl, kNoCancel));
          (void)len;
        }
      }
      return {};
    };
    // Iterations: as given, else as many as fit in seconds_per_size.
    const uint32_t warm = o.warmup ? o.warmup : 3;
    for (uint32_t i = 0; i < warm; ++i)
      if (Status s = one_batch(deadline_in(30s)); !s.ok()) return fail(s);
    std::vector<double> lat;
    lat.reserve(1 << 20);
    // One clock read per iteration (its end is the next one's start): on a VM a read
    // costs ~25 ns, a tenth of a shared-memory round trip.
    const auto start = Clock::now();
    auto t_prev = start;
    while (true) {
      if (Status s = one_batch(t_prev + 30s); !s.ok()) return fail(s);
      const auto t = Clock::now();
      lat.push_back(std::chrono::duration<double, std::micro>(t - t_prev).count());
      t_prev = t;
      if (o.iterations ? lat.size() >= o.iterations
                       : (t - start > std::chrono::duration<double>(o.seconds_per_size) && lat.size() >= 10))
        break;
    }
    const double total = std::chrono::duration<double>(t_prev - start).count();
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double p) { return lat[std::min(lat.size() - 1, size_t(p * double(lat.size())))]; };
    double avg = 0;
    for (double v : lat) avg += v;
    avg /= double(lat.size());
    Row r{block, o.batch, double(block) * o.batch * double(lat.size()) / total, avg, pct(0.5), pct(0.99), pct(0.999)};
    rows.push_back(r);
    fmt::print("{:>12} {:>6} {:>10.3f} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n", block, o.batch, r.bytes_per_s / 1e9,
               r.avg, r.p50, r.p99, r.p999);
    std::fflush(stdout);
  }
  Ctl done{5, 0, 0};
  (void)(*c)->send(as_bytes(done), {}, deadline_in(5s), {});
  if (!o.json.empty()) {
    nlohmann::json j;
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows)
      j["rows"].push_back({{"backend", o.backend.name}, {"mode", o.mode}, {"block_bytes", r.block}, {"batch", r.batch},
                           {"bytes_per_s", r.bytes_per_s}, {"lat_us_avg", r.avg}, {"lat_us_p50", r.p50},
                           {"lat_us_p99", r.p99}, {"lat_us_p999", r.p999}});
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvstream point-to-point transport benchmark"};
  Options o;
  app.add_flag("--server", o.server, "run the server side");
  app.add_option("--client", o.client, "server host to connect to (with --server: address to bind, default 127.0.0.1)");
  app.add_option("--port", o.port, "port")->capture_default_str();
  app.add_option("--backend", o.backend.name, "tcp, ucx or libfabric")->capture_default_str();
  app.add_option("--ucx-tls", o.backend.ucx.tls, "UCX transports (UCX_TLS)");
  app.add_flag("!--ucx-no-peer-errors", o.backend.ucx.peer_errors,
               "UCX without peer error handling (lets shared memory use cma; a crashed peer shows as a timeout)");
  app.add_option("--ofi-provider", o.backend.libfabric.provider, "libfabric provider")->capture_default_str();
  std::vector<std::string> settings;
  app.add_option("--transport", settings,
                 "a backend setting as name=value, applied after the options above (e.g. tcp.send_zc=true, "
                 "tcp.socket_buffer_bytes=4194304); repeatable. --transport help lists them");
  app.add_option("--memory", o.backend.memory, "host or cuda")
      ->transform(CLI::CheckedTransformer(std::map<std::string, MemoryType>{{"host", MemoryType::host},
                                                                          {"cuda", MemoryType::cuda}}));
  app.add_option("--min-block", o.min_block, "smallest block of the sweep")->capture_default_str();
  app.add_option("--max-block", o.max_block, "largest block of the sweep (and buffer size)")->capture_default_str();
  app.add_option("--block", o.only_block, "one block size instead of the sweep");
  app.add_option("--batch", o.batch, "messages in flight per iteration")->capture_default_str();
  app.add_option("--iterations", o.iterations, "timed iterations per size (0: --seconds worth)");
  app.add_option("--warmup", o.warmup, "untimed iterations per size (default 3)");
  app.add_option("--seconds", o.seconds_per_size, "time per block size when --iterations is 0")->capture_default_str();
  app.add_option("--mode", o.mode,
                 "write (client sends), read (server sends) or get (client reads the server's buffer one-sidedly)")
      ->check(CLI::IsMember({"write", "read", "get"}))
      ->capture_default_str();
  app.add_option("--json", o.json, "write the rows as JSON");
  CLI11_PARSE(app, argc, argv);
  for (const std::string& a : settings) {
    if (a == "help") return fmt::print("{}", o.backend.describe()), 0;
    if (Status st = o.backend.set(a); !st.ok())
      return fmt::print(stderr, "kvstream-perf: --transport {}: {}\n", a, st.to_string()), 2;
  }
  if (o.only_block > o.max_block) o.max_block = o.only_block;
  if (o.server) return run_server(o);
  if (o.client.empty()) return fmt::print(stderr, "kvstream-perf: give --server or --client HOST\n"), 2;
  return run_client(o);
}
