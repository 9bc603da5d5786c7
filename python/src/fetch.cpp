// kvstream.Fetch: a fetch in progress (KvStore.fetch / fetch_paged). wait() blocks
// with the GIL released; cancel() may be called from another thread meanwhile. The
// destination arrays stay exported (alive, not resizable) until the fetch has ended:
// after wait() returns, or when the object goes away (which cancels and waits).
#include "bindings.hpp"

namespace kvspy {

Fetch::Fetch(kvstream::StoreFetch fetch, HostKv destination, std::shared_ptr<std::atomic<uint32_t>> chunks_done,
             bool refinable)
    : fetch_(std::move(fetch)),
      buffers_(std::move(destination.buffers)),
      chunks_done_(std::move(chunks_done)),
      refinable_(refinable) {
  tokens_ = fetch_->tokens();
}

Fetch::~Fetch() {
  {
    // Destroying a running StoreFetch cancels it and waits for the pipeline to let
    // go of the destination: without the GIL, then the exports are released.
    py::gil_scoped_release nogil;
    std::lock_guard lk(mu_);
    fetch_.reset();
  }
  buffers_.clear();
}

py::object Fetch::wait() {
  if (report_) return report_;
  kvstream::Result<kvstream::FetchReport> r = kvstream::Status(kvstream::StatusCode::internal, "not waited");
  {
    py::gil_scoped_release nogil;
    std::lock_guard lk(mu_);
    r = fetch_->wait();
  }
  // Ended: nothing writes into the destination any more, unless refine() will.
  finished_ = true;
  if (!refinable_) buffers_.clear();
  if (!r.ok()) throw_status(r.status());
  report_ = to_py(*r);
  return report_;
}

void Fetch::cancel() {
  if (fetch_) fetch_->cancel();  // thread-safe against a wait in progress
}

py::dict Fetch::refine(uint32_t level, py::handle timeout) {
  if (!refinable_)
    throw_status(kvstream::Status(kvstream::StatusCode::invalid_argument,
                                  "refine: the fetch was not started with refinable=True"));
  const auto deadline = deadline_after(timeout);
  kvstream::Result<kvstream::pipeline::RefineReport> r =
      kvstream::Status(kvstream::StatusCode::internal, "not refined");
  {
    py::gil_scoped_release nogil;
    std::lock_guard lk(mu_);
    r = fetch_->refine(level, deadline);
  }
  if (!r.ok()) throw_status(r.status());
  py::dict d;
  d["chunks_refined"] = r->chunks_refined;
  d["bytes"] = r->bytes;
  return d;
}

void init_fetch(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<Fetch>(m, "Fetch", R"doc(
A fetch in progress, from KvStore.fetch or KvStore.fetch_paged. Chunks land in the
destination as they arrive; wait() returns the FetchReport once all have (or raises:
TimedOut when the deadline passed, Cancelled after cancel(), the first chunk's error).
The destination arrays are held (kept alive) until the fetch has ended. Dropping a
running Fetch cancels it and waits for it. Usable as a context manager: leaving the
block cancels a fetch that was not waited for.
)doc")
      .def("wait", &Fetch::wait,
           "wait() -> FetchReport: blocks (GIL released) until the fetch ends. Waiting again returns the same report "
           "(or raises the same error).")
      .def("cancel", &Fetch::cancel,
           "cancel(): stops the fetch (undelivered chunks end cancelled); wait() then raises Cancelled unless every "
           "chunk had landed. Safe from another thread while one waits.")
      .def("refine", &Fetch::refine, "level"_a = 0u, "timeout"_a = py::none(),
           "refine(level=0, timeout=30.0) -> dict: for a fetch started with refinable=True, after wait(): fetches "
           "only the bytes each chunk lacks for `level` (progressive profiles) and upgrades its KV in the "
           "destination in place, exactly as a fetch at `level` would have written it. Returns {'chunks_refined', "
           "'bytes'}. Raises InvalidArgument (not refinable, not waited, a single-level profile).")
      .def_property_readonly("tokens", &Fetch::tokens, "Tokens [0, tokens) the fetch covers (whole stored chunks).")
      .def_property_readonly("finished", &Fetch::finished, "True once wait() has returned or raised.")
      .def_property_readonly("chunks_done", &Fetch::chunks_done,
                             "Chunks delivered (or reported for recompute, or failed) so far.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Fetch& f, py::handle, py::handle, py::handle) {
        if (f.finished()) return false;
        f.cancel();
        try {
          (void)f.wait();
        } catch (const StatusError&) {
          // the cancel's own outcome
        }
        return false;
      });
}

}  // namespace kvspy
