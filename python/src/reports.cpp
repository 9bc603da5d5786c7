// C++ results as the frozen dataclasses of kvstream._types (plain Python values, so
// they print, compare and pickle like any dataclass).
#include "bindings.hpp"

namespace kvspy {
namespace {

using namespace pybind11::literals;
using Clock = kvstream::transport::Clock;

py::object type(const char* name) { return py::module_::import("kvstream._types").attr(name); }

const char* action_name(kvstream::pipeline::ChunkDecision::Action a) {
  return a == kvstream::pipeline::ChunkDecision::Action::recompute ? "recompute" : "fetch";
}

double seconds(Clock::time_point a, Clock::time_point b) {
  if (a == Clock::time_point{} || b == Clock::time_point{} || b < a) return 0.0;
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

py::object to_py(const kvstream::PutReport& r) {
  return type("PutReport")("chunks"_a = r.chunks, "already_stored"_a = r.already_stored, "bytes"_a = r.bytes,
                           "tokens"_a = r.tokens, "evicted_chunks"_a = r.evicted_chunks,
                           "evicted_bytes"_a = r.evicted_bytes);
}

py::object to_py(const kvstream::FetchReport& r) {
  py::list recompute, chunks;
  for (const auto& t : r.recompute) recompute.append(py::make_tuple(t.begin, t.end));
  const py::object chunk_type = type("ChunkReport");
  for (const auto& c : r.chunks)
    chunks.append(chunk_type("chunk"_a = c.chunk, "action"_a = action_name(c.decision.action),
                             "level"_a = c.decision.level, "bytes"_a = c.bytes,
                             "wire_seconds"_a = seconds(c.wire_start, c.wire_end),
                             "decode_seconds"_a = seconds(c.decode_start, c.decode_end),
                             "status"_a = std::string(kvstream::status_code_name(c.status.code())),
                             "message"_a = c.status.message()));
  return type("FetchReport")("tokens"_a = r.tokens, "recompute"_a = recompute, "bytes"_a = r.bytes,
                             "mean_quality_loss_pct"_a = r.mean_quality_loss_pct,
                             "max_quality_loss_pct"_a = r.max_quality_loss_pct, "chunks"_a = chunks);
}

py::object to_py(const kvstream::FetchPlan& r) {
  py::list decisions;
  const py::object decision_type = type("ChunkDecision");
  for (const auto& d : r.decisions) decisions.append(decision_type(action_name(d.action), d.level));
  return type("FetchPlan")("tokens"_a = r.tokens, "fits"_a = r.fits, "predicted_seconds"_a = r.predicted_seconds,
                           "mean_quality_loss_pct"_a = r.mean_quality_loss_pct,
                           "recompute_chunks"_a = r.recompute_chunks, "decisions"_a = decisions);
}

py::object to_py(const kvstream::EvictReport& r) {
  return type("EvictReport")("chunks_removed"_a = r.chunks_removed, "bytes_removed"_a = r.bytes_removed,
                             "bytes_kept"_a = r.bytes_kept);
}

py::object to_py(const kvstream::KvGeometry& g) {
  const char* kind = g.kind == kvstream::AttentionKind::mla   ? "mla"
                     : g.kind == kvstream::AttentionKind::gqa ? "gqa"
                                                              : "mha";
  return type("Geometry")("layers"_a = g.layers, "kv_heads"_a = g.kv_heads, "head_dim"_a = g.head_dim,
                          "q_heads"_a = g.q_heads, "kind"_a = kind, "planes"_a = g.planes(),
                          "channels"_a = g.channels());
}

py::object level_infos(const kvstream::codec::Profile& p) {
  py::list out;
  const py::object info = type("LevelInfo");
  for (uint32_t l = 0; l < p.levels(); ++l) {
    const auto& li = p.level(l);
    out.append(info("level"_a = l, "step"_a = li.step, "bits_per_element"_a = li.bits_per_element,
                    "ppl_increase_pct"_a = li.ppl_increase_pct, "kl_nats"_a = li.kl_nats));
  }
  return out;
}

py::object settings_list() {
  py::list out;
  const py::object setting = type("Setting");
  for (const auto& s : kvstream::store_settings())
    out.append(setting(std::string(s.name), s.default_value, s.env, std::string(s.doc)));
  return out;
}

}  // namespace kvspy
