// Shared pieces of the kvstream._kvstream extension: how a kvstream Status becomes a
// Python exception, how tokens and KV arrays (numpy, torch CPU tensors, anything
// with the buffer protocol) become kvstream types without copying the KV, deadlines
// from timeouts, and the init function of each part (one file per concept).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kvstream/kvstream.hpp"

namespace py = pybind11;

namespace kvspy {

// ---- errors.cpp --------------------------------------------------------------------

/// Thrown by the bindings (never with a Python error pending); translated into the
/// kvstream.Error subclass of its code. `type_error`: the InvalidType subclass
/// (InvalidArgument that is also a TypeError: wrong dtype or object kind).
struct StatusError : std::exception {
  explicit StatusError(kvstream::Status s, bool type_error = false) : status(std::move(s)), type_error(type_error) {}
  const char* what() const noexcept override { return status.message().c_str(); }
  kvstream::Status status;
  bool type_error = false;
};

[[noreturn]] inline void throw_status(kvstream::Status s) { throw StatusError(std::move(s)); }
template <typename... Args>
[[noreturn]] void throw_invalid(fmt::format_string<Args...> f, Args&&... args) {
  throw StatusError(kvstream::make_status(kvstream::StatusCode::invalid_argument, f, std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void throw_type(fmt::format_string<Args...> f, Args&&... args) {
  throw StatusError(kvstream::make_status(kvstream::StatusCode::invalid_argument, f, std::forward<Args>(args)...),
                    true);
}
inline void check(const kvstream::Status& s) {
  if (!s.ok()) throw_status(s);
}
template <typename T>
T unwrap(kvstream::Result<T> r) {
  if (!r.ok()) throw_status(r.status());
  return std::move(r).value();
}

/// Runs a blocking kvstream call with the GIL released (other Python threads run
/// meanwhile) and returns its value, or raises its error once the GIL is back.
template <typename Fn>
auto without_gil(Fn&& fn) {
  std::optional<decltype(fn())> r;
  {
    py::gil_scoped_release nogil;
    r.emplace(fn());
  }
  return unwrap(std::move(*r));
}

void init_errors(py::module_& m);

// ---- arrays.cpp ----------------------------------------------------------------------

/// A buffer exported by a caller's array (numpy's, or the numpy view of a torch
/// tensor), held for as long as kvstream may read or write its memory. The export
/// keeps the array alive and unresizable; released (with the GIL) on destruction.
class HeldBuffer {
 public:
  HeldBuffer() = default;
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  ~HeldBuffer();
  Py_buffer view{};
  bool held = false;
};

/// KV in the caller's memory: the view kvstream reads or writes, and the exports
/// that keep that memory valid.
struct HostKv {
  kvstream::KvView view;
  kvstream::DType dtype = kvstream::DType::f32;
  std::vector<std::unique_ptr<HeldBuffer>> buffers;
  uint64_t capacity_tokens = 0;  ///< tokens the memory holds (packed: the array's; paged: the table's)
};

/// Token ids from a list of ints, a 1-D integer numpy array or torch tensor, or any
/// sequence of ints (copied to int32; each must fit).
std::vector<kvstream::Token> to_tokens(py::handle obj);
/// Unsigned ints (block tables, levels) from the same kinds of objects.
std::vector<uint32_t> to_u32_list(py::handle obj, const char* what);

/// A packed KV array [layers, planes, tokens, channels] or [layers, planes, tokens,
/// kv_heads, head_dim] of float32 / float16 (bfloat16: torch tensors only), C-contiguous.
/// `writable`: a fetch destination (a read-only array is refused).
HostKv packed_kv(py::handle array, const kvstream::KvGeometry& g, bool writable);
/// vLLM's paged layout: one array per layer, [planes, num_blocks, block_size, kv_heads,
/// head_dim] (or [..., channels]), all of one shape and dtype, C-contiguous; the view
/// covers min(len(block_table) * block_size, max_tokens when > 0) tokens.
HostKv paged_kv(py::handle layers, py::handle block_table, uint32_t block_size, const kvstream::KvGeometry& g,
                bool writable, uint64_t max_tokens = 0);

// ---- deadlines -------------------------------------------------------------------------

/// A deadline `timeout` from now: seconds (int or float) or a datetime.timedelta;
/// None: kDefaultTimeoutS. Errors: invalid_argument when not > 0.
kvstream::transport::Deadline deadline_after(py::handle timeout);
inline constexpr double kDefaultTimeoutS = 30.0;

// ---- reports.cpp: C++ results as the dataclasses of kvstream._types ---------------------

py::object to_py(const kvstream::PutReport& r);
py::object to_py(const kvstream::FetchReport& r);
py::object to_py(const kvstream::FetchPlan& r);
py::object to_py(const kvstream::EvictReport& r);
py::object to_py(const kvstream::KvGeometry& g);
py::object level_infos(const kvstream::codec::Profile& p);
py::object settings_list();

// ---- fetch.cpp: kvstream.Fetch ------------------------------------------------------------

/// A fetch in progress, with the exports of its destination arrays: they stay held
/// (the arrays alive and their memory valid) until the fetch has ended.
class Fetch {
 public:
  Fetch(kvstream::StoreFetch fetch, HostKv destination, std::shared_ptr<std::atomic<uint32_t>> chunks_done,
        bool refinable = false);
  Fetch(const Fetch&) = delete;
  Fetch& operator=(const Fetch&) = delete;
  ~Fetch();
  /// Waits (GIL released) for the end; the report, or raises.
  py::object wait();
  void cancel();
  /// Refinement (refinable fetches, after wait()): {"chunks_refined", "bytes"}, or raises.
  py::dict refine(uint32_t level, py::handle timeout);
  [[nodiscard]] uint64_t tokens() const noexcept { return tokens_; }
  [[nodiscard]] bool finished() const noexcept { return finished_; }
  [[nodiscard]] uint32_t chunks_done() const noexcept { return chunks_done_->load(); }

 private:
  std::mutex mu_;  // serializes waits (taken with the GIL released)
  std::optional<kvstream::StoreFetch> fetch_;
  std::vector<std::unique_ptr<HeldBuffer>> buffers_;
  std::shared_ptr<std::atomic<uint32_t>> chunks_done_;
  uint64_t tokens_ = 0;
  bool finished_ = false;
  bool refinable_ = false;  // the destination stays held after wait(): refine() writes into it
  py::object report_;
};

// ---- parts -------------------------------------------------------------------------------

void init_config(py::module_& m);
void init_fetch(py::module_& m);
void init_store(py::module_& m);
void init_server(py::module_& m);

}  // namespace kvspy
