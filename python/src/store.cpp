// kvstream.KvStore: the front door (kvstream/kv_store.hpp) for Python runtimes. Every
// blocking call runs with the GIL released; KV arrays are used in place (see
// arrays.cpp); results are the dataclasses of kvstream._types.
#include "bindings.hpp"

namespace kvspy {
namespace {

using kvstream::KvStore;

class Store {
 public:
  explicit Store(std::shared_ptr<KvStore> s) : s_(std::move(s)) {}
  ~Store() { close(); }

  // The store for one call: a reference of its own, so that close() from another
  // thread while this call runs without the GIL cannot pull it away.
  std::shared_ptr<KvStore> get() const {
    if (!s_) throw_invalid("the KvStore is closed");
    return s_;
  }
  void close() {
    std::shared_ptr<KvStore> s = std::move(s_);
    py::gil_scoped_release nogil;  // joins the pipeline's threads when this was the last reference
    s.reset();
  }
  [[nodiscard]] bool closed() const { return !s_; }

 private:
  std::shared_ptr<KvStore> s_;
};

// max_tokens for a fetch into memory that holds `capacity` tokens.
uint64_t capped(uint64_t max_tokens, uint64_t capacity, uint32_t chunk_tokens) {
  const uint64_t cap = max_tokens > 0 ? std::min(max_tokens, capacity) : capacity;
  if (cap < chunk_tokens)
    throw_invalid("fetch: the destination holds {} tokens (max_tokens {}), less than one {}-token chunk", capacity,
                  max_tokens, chunk_tokens);
  return cap;
}

py::object put(Store& self, py::handle tokens, const HostKv& kv, py::handle timeout, bool overwrite) {
  auto store = self.get();
  const auto toks = to_tokens(tokens);
  kvstream::PutOptions o;
  o.overwrite = overwrite;
  const auto deadline = deadline_after(timeout);
  return to_py(without_gil([&] { return store->put(toks, kv.view, deadline, o); }));
}

std::unique_ptr<Fetch> start_fetch(Store& self, py::handle tokens, HostKv dest, py::handle timeout,
                                   std::optional<uint32_t> level, uint64_t max_tokens, int priority, bool refinable) {
  auto store = self.get();
  const auto toks = to_tokens(tokens);
  kvstream::FetchOptions o;
  o.max_tokens = capped(max_tokens, dest.capacity_tokens, store->chunk_tokens());
  o.level = level;
  o.priority = priority;
  o.keep_for_refinement = refinable;
  auto done = std::make_shared<std::atomic<uint32_t>>(0);
  o.on_chunk = [done](const kvstream::pipeline::ChunkTimings&) { done->fetch_add(1); };
  const auto deadline = deadline_after(timeout);
  kvstream::FetchDestination d;
  d.host = dest.view;
  auto f = without_gil([&] { return store->fetch(toks, d, deadline, std::move(o)); });
  return std::make_unique<Fetch>(std::move(f), std::move(dest), std::move(done), refinable);
}

}  // namespace

kvstream::transport::Deadline deadline_after(py::handle timeout) {
  double seconds = kDefaultTimeoutS;
  if (!timeout.is_none()) {
    py::object v = py::reinterpret_borrow<py::object>(timeout);
    if (py::hasattr(v, "total_seconds")) v = v.attr("total_seconds")();  // datetime.timedelta
    if (PyBool_Check(v.ptr()) || !PyNumber_Check(v.ptr()))
      throw_type("timeout: expected seconds (a number) or a datetime.timedelta, got {}", Py_TYPE(v.ptr())->tp_name);
    seconds = py::cast<double>(py::float_(v));
  }
  if (!(seconds > 0)) throw_invalid("timeout must be > 0 seconds, got {}", seconds);
  seconds = std::min(seconds, 365.0 * 24 * 3600);  // "forever" stays representable
  return kvstream::transport::Clock::now() +
         std::chrono::duration_cast<kvstream::transport::Clock::duration>(std::chrono::duration<double>(seconds));
}

void init_store(py::module_& m) {
  using namespace pybind11::literals;
  const py::arg_v timeout("timeout", py::float_(kDefaultTimeoutS));
  py::class_<Store>(m, "KvStore", R"doc(
The front door: stores the KV cache of token prefixes and streams it back into a
runtime's memory (packed arrays, or vLLM-style paged caches), each chunk at a
compression level chosen against the fetch's deadline.

    with kvstream.KvStore.open(cfg) as store:
        store.put(tokens, kv)                    # kv: [layers, 2, tokens, kv_heads*head_dim]
        n = store.lookup(other_prompt)           # leading tokens stored (whole chunks)
        report = store.fetch(other_prompt, dest).wait()

Tokens: a list of ints, a 1-D integer numpy array or torch tensor. KV arrays: numpy
arrays or torch CPU tensors (through Tensor.numpy(), which shares the tensor's
memory: nothing is copied), float32 or float16 (bfloat16 tensors too), C-contiguous.
Timeouts are seconds (or datetime.timedelta); a fetch's timeout is also the deadline
its adaptive level choice plans against. Every blocking call releases the GIL.
Thread-safe.
)doc")
      .def_static(
          "open",
          [](const kvstream::StoreConfig& config) {
            return std::make_unique<Store>(
                std::make_shared<KvStore>(without_gil([&] { return KvStore::open(config); })));
          },
          py::arg("config"),
          "open(config) -> KvStore: connects to the storage, loads the codec profile, starts the fetch pipeline. "
          "`config` is a StoreConfig or a dict of settings. Raises InvalidArgument (config), the profile's errors, "
          "Unavailable, PermissionDenied, TimedOut.")
      .def(
          "put",
          [](Store& self, py::handle tokens, py::handle kv, py::handle timeout, bool overwrite) {
            const HostKv host = packed_kv(kv, self.get()->geometry(), false);
            return put(self, tokens, host, timeout, overwrite);
          },
          "tokens"_a, "kv"_a, timeout, "overwrite"_a = false,
          "put(tokens, kv, timeout=30.0, overwrite=False) -> PutReport: stores every whole chunk of `tokens` from "
          "packed KV (token 0 at position 0, at least as many tokens as the whole chunks), at every level, skipping "
          "chunks found stored (a shared prefix) unless `overwrite`.")
      .def(
          "put_paged",
          [](Store& self, py::handle tokens, py::handle layers, py::handle block_table, std::optional<uint32_t> block_size,
             py::handle timeout, bool overwrite) {
            const HostKv host = paged_kv(layers, block_table, block_size.value_or(0), self.get()->geometry(), false);
            return put(self, tokens, host, timeout, overwrite);
          },
          "tokens"_a, "layers"_a, "block_table"_a, "block_size"_a = py::none(), timeout, "overwrite"_a = false,
          "put_paged(tokens, layers, block_table, block_size=None, ...) -> PutReport: put() reading the KV straight "
          "from a paged cache (see fetch_paged for the layout).")
      .def(
          "lookup",
          [](Store& self, py::handle tokens, py::handle timeout) {
            auto store = self.get();
            const auto toks = to_tokens(tokens);
            const auto deadline = deadline_after(timeout);
            return without_gil([&] { return store->lookup(toks, deadline); });
          },
          "tokens"_a, timeout,
          "lookup(tokens, timeout=30.0) -> int: how many leading tokens of `tokens` are stored (a multiple of "
          "chunk_tokens).")
      .def(
          "plan",
          [](Store& self, py::handle tokens, py::handle timeout, uint64_t max_tokens, int priority) {
            auto store = self.get();
            const auto toks = to_tokens(tokens);
            kvstream::FetchOptions o;
            o.max_tokens = max_tokens;
            o.priority = priority;
            const auto deadline = deadline_after(timeout);
            return to_py(without_gil([&] { return store->plan(toks, deadline, o); }));
          },
          "tokens"_a, timeout, "max_tokens"_a = 0, "priority"_a = 0,
          "plan(tokens, timeout=30.0, max_tokens=0, priority=0) -> FetchPlan: what an adaptive fetch with this "
          "deadline would do if started now. Raises NotFound when nothing is stored.")
      .def(
          "fetch",
          [](Store& self, py::handle tokens, py::handle dest, py::handle timeout, std::optional<uint32_t> level,
             uint64_t max_tokens, int priority, bool refinable) {
            HostKv host = packed_kv(dest, self.get()->geometry(), true);
            return start_fetch(self, tokens, std::move(host), timeout, level, max_tokens, priority, refinable);
          },
          "tokens"_a, "dest"_a, timeout, "level"_a = py::none(), "max_tokens"_a = 0, "priority"_a = 0,
          "refinable"_a = false,
          "fetch(tokens, dest, timeout=30.0, level=None, max_tokens=0, priority=0, refinable=False) -> Fetch: starts "
          "fetching the stored prefix of `tokens` (at most max_tokens when > 0, and at most what `dest` holds; whole "
          "chunks) into the packed array `dest` [layers, 2, tokens, channels] (writable; token 0 = position 0). Each "
          "chunk goes at the level the chooser picks against the deadline (policy.max_quality_loss_pct bounds it), or "
          "at `level` for every chunk. refinable=True keeps the fetched bytes (and `dest`) so that Fetch.refine() can "
          "upgrade the KV later. Raises NotFound (nothing stored), InvalidArgument, InvalidType.")
      .def(
          "fetch_paged",
          [](Store& self, py::handle tokens, py::handle layers, py::handle block_table, std::optional<uint32_t> block_size,
             py::handle timeout, std::optional<uint32_t> level, uint64_t max_tokens, int priority, bool refinable) {
            HostKv host = paged_kv(layers, block_table, block_size.value_or(0), self.get()->geometry(), true, max_tokens);
            return start_fetch(self, tokens, std::move(host), timeout, level, max_tokens, priority, refinable);
          },
          "tokens"_a, "layers"_a, "block_table"_a, "block_size"_a = py::none(), timeout, "level"_a = py::none(),
          "max_tokens"_a = 0, "priority"_a = 0, "refinable"_a = false,
          "fetch_paged(tokens, layers, block_table, block_size=None, timeout=30.0, level=None, max_tokens=0, "
          "priority=0, refinable=False) -> Fetch: fetch() into a vLLM-style paged cache: `layers` holds one contiguous array per "
          "layer of shape [2, num_blocks, block_size, kv_heads, head_dim] (K then V); position p lands in block "
          "block_table[p // block_size], slot p % block_size. At most len(block_table) * block_size tokens are "
          "fetched. block_size None: the layers' own.")
      .def(
          "remove",
          [](Store& self, py::handle tokens, py::handle timeout) {
            auto store = self.get();
            const auto toks = to_tokens(tokens);
            const auto deadline = deadline_after(timeout);
            return without_gil([&] { return store->remove(toks, deadline); });
          },
          "tokens"_a, timeout,
          "remove(tokens, timeout=30.0) -> int: removes the stored chunks of `tokens` (prompts sharing them lose "
          "them too); returns how many were removed.")
      .def(
          "evict",
          [](Store& self, uint64_t max_bytes, uint64_t max_age_s, py::handle timeout) {
            auto store = self.get();
            const auto deadline = deadline_after(timeout);
            return to_py(
                without_gil([&] { return store->evict(max_bytes, std::chrono::seconds(max_age_s), deadline); }));
          },
          "max_bytes"_a = 0, "max_age_s"_a = 0, timeout,
          "evict(max_bytes=0, max_age_s=0, timeout=30.0) -> EvictReport: removes this model's chunks older than "
          "max_age_s (0: no bound), then the deepest chunks until at most max_bytes are kept (0: no bound).")
      .def(
          "chunk_keys", [](Store& self, py::handle tokens) { return self.get()->chunk_keys(to_tokens(tokens)); },
          "tokens"_a, "chunk_keys(tokens) -> list[str]: the stored name of each whole chunk of `tokens`.")
      .def_property_readonly(
          "geometry", [](Store& self) { return to_py(self.get()->geometry()); },
          "Geometry of the KV (the codec profile's): layers, kv_heads, head_dim, planes, ...")
      .def_property_readonly(
          "chunk_tokens", [](Store& self) { return self.get()->chunk_tokens(); }, "Tokens per stored chunk.")
      .def_property_readonly(
          "model_id", [](Store& self) { return self.get()->config().codec.model_id; }, "The model id in every key.")
      .def_property_readonly(
          "levels", [](Store& self) { return level_infos(self.get()->profile()); },
          "The codec profile's levels (step, bits per element, measured quality), finest first.")
      .def_property_readonly(
          "profile_hash", [](Store& self) { return self.get()->profile().hash(); }, "The codec profile's hash.")
      .def_property_readonly(
          "config", [](Store& self) { return self.get()->config(); }, "A copy of the StoreConfig it was opened with.")
      .def_property_readonly("closed", &Store::closed)
      .def("close", &Store::close,
           "close(): disconnects and stops the pipeline (running fetches keep what they need until they end).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Store& self, py::handle, py::handle, py::handle) {
        self.close();
        return false;
      });
}

}  // namespace kvspy
