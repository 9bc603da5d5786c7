// Caller memory as kvstream types, without copying KV: numpy arrays through the
// buffer protocol, torch CPU tensors through Tensor.numpy() (which shares the
// tensor's memory; bfloat16 tensors through their int16 view, as numpy has no
// bfloat16). Shape, dtype, C-contiguity and (for destinations) writability are
// checked here, with errors naming what was expected.
#include <cctype>
#include <cstring>

#include <fmt/ranges.h>

#include "bindings.hpp"

namespace kvspy {

using kvstream::DType;
using kvstream::KvGeometry;
using kvstream::KvView;

HeldBuffer::~HeldBuffer() {
  if (!held) return;
  py::gil_scoped_acquire gil;  // also right when the GIL is already held
  PyBuffer_Release(&view);
}

namespace {

std::string type_name(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

std::vector<Py_ssize_t> shape_of(const Py_buffer& v) {
  std::vector<Py_ssize_t> s;
  for (int i = 0; i < v.ndim; ++i) s.push_back(v.shape ? v.shape[i] : 0);
  return s;
}

// torch.Tensor -> its numpy view (memory shared); anything else as it is.
py::object array_of(py::handle obj, bool& bf16, const char* what) {
  bf16 = false;
  const py::dict modules = py::module_::import("sys").attr("modules");
  if (!modules.contains("torch")) return py::reinterpret_borrow<py::object>(obj);
  const py::object torch = modules["torch"];
  if (!py::isinstance(obj, torch.attr("Tensor"))) return py::reinterpret_borrow<py::object>(obj);
  py::object t = obj.attr("detach")();
  const std::string device = py::str(t.attr("device").attr("type"));
  if (device != "cpu")
    throw_type("{}: a torch tensor on '{}'; kvstream's Python API takes CPU tensors (host memory)", what, device);
  if (t.attr("dtype").equal(torch.attr("bfloat16"))) {
    bf16 = true;
    t = t.attr("view")(torch.attr("int16"));
  }
  return t.attr("numpy")();
}

std::unique_ptr<HeldBuffer> export_buffer(py::handle obj, bool writable, const char* what) {
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()))
    throw_type("{}: expected a numpy array or a torch CPU tensor, got {}", what, type_name(obj));
  auto b = std::make_unique<HeldBuffer>();
  if (PyObject_GetBuffer(obj.ptr(), &b->view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    throw_type("{}: expected a numpy array or a torch CPU tensor, got {}", what, type_name(obj));
  }
  b->held = true;
  if (writable && b->view.readonly)
    throw_invalid("{}: the array is read-only; a fetch destination must be writable", what);
  return b;
}

// The buffer format without its byte-order prefix; big-endian data is refused.
std::string_view element_format(const Py_buffer& v, const char* what) {
  std::string_view f = v.format ? v.format : "B";
  if (!f.empty() && std::strchr("@=<>!", f[0])) {
    if (f[0] == '>' || f[0] == '!') throw_type("{}: big-endian data (format '{}'); use native byte order", what, f);
    f.remove_prefix(1);
  }
  return f;
}

const char* format_name(std::string_view f) {
  if (f.size() != 1) return "a structured type";
  switch (f[0]) {
    case 'd': return "float64";
    case 'f': return "float32";
    case 'e': return "float16";
    case '?': return "bool";
    case 'b': return "int8";
    case 'B': return "uint8";
    case 'h': return "int16";
    case 'H': return "uint16";
    case 'i': return "int32";
    case 'I': return "uint32";
    case 'l': case 'q': case 'n': return "int64";
    case 'L': case 'Q': case 'N': return "uint64";
    case 'Z': return "complex";
    default: return "an unsupported type";
  }
}

DType kv_dtype(const Py_buffer& v, bool bf16, const char* what) {
  const std::string_view f = element_format(v, what);
  if (bf16 && (f == "h" || f == "H") && v.itemsize == 2) return DType::bf16;
  if (f == "f" && v.itemsize == 4) return DType::f32;
  if (f == "e" && v.itemsize == 2) return DType::f16;
  throw_type("{}: dtype must be float32 or float16 (or torch.bfloat16), got {} (buffer format '{}')", what,
             format_name(f), v.format ? v.format : "B");
}

void check_contiguous(const Py_buffer& v, const char* what) {
  Py_ssize_t expect = v.itemsize;
  for (int i = v.ndim - 1; i >= 0; --i) {
    if (v.shape[i] != 1 && v.strides && v.strides[i] != expect)
      throw_invalid("{}: not C-contiguous (shape {}, byte strides {}); pass np.ascontiguousarray(a) or "
                    "tensor.contiguous()",
                    what, shape_of(v), std::vector<Py_ssize_t>(v.strides, v.strides + v.ndim));
    expect *= v.shape[i];
  }
}

// Every element of a 1-D integer buffer, or of a sequence of ints.
std::vector<int64_t> ints_of(py::handle obj, const char* what) {
  bool bf16 = false;
  const py::object o = array_of(obj, bf16, what);
  std::vector<int64_t> out;
  if (PyObject_CheckBuffer(o.ptr()) && !PyBytes_Check(o.ptr()) && !PyByteArray_Check(o.ptr())) {
    auto b = export_buffer(o, false, what);
    const Py_buffer& v = b->view;
    const std::string_view f = element_format(v, what);
    const bool is_int = f.size() == 1 && std::strchr("bBhHiIlLqQnN", f[0]);
    if (!is_int || bf16) throw_type("{}: expected integers, got {}", what, format_name(f));
    if (v.ndim != 1) throw_invalid("{}: expected a 1-D array, got shape {}", what, shape_of(v));
    const bool is_signed = std::islower(static_cast<unsigned char>(f[0]));
    const auto* base = static_cast<const char*>(v.buf);
    for (Py_ssize_t i = 0; i < v.shape[0]; ++i) {
      const char* p = base + i * (v.strides ? v.strides[0] : v.itemsize);
      int64_t x = 0;
      switch (v.itemsize) {
        case 1: x = is_signed ? int64_t(*reinterpret_cast<const int8_t*>(p)) : int64_t(*reinterpret_cast<const uint8_t*>(p)); break;
        case 2: { int16_t s; uint16_t u; std::memcpy(&s, p, 2); std::memcpy(&u, p, 2); x = is_signed ? s : u; break; }
        case 4: { int32_t s; uint32_t u; std::memcpy(&s, p, 4); std::memcpy(&u, p, 4); x = is_signed ? s : int64_t(u); break; }
        case 8: {
          std::memcpy(&x, p, 8);
          if (!is_signed && x < 0) throw_invalid("{}[{}] is too large", what, i);
          break;
        }
        default: throw_type("{}: {}-byte integers", what, v.itemsize);
      }
      out.push_back(x);
    }
    return out;
  }
  if (!PySequence_Check(o.ptr()) || PyUnicode_Check(o.ptr()) || PyBytes_Check(o.ptr()))
    throw_type("{}: expected a list of ints, a 1-D integer numpy array or torch tensor, got {}", what, type_name(o));
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(o);
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) {
    const py::object item = seq[i];
    if (!PyIndex_Check(item.ptr()) || PyBool_Check(item.ptr()))
      throw_type("{}[{}]: expected an int, got {}", what, i, type_name(item));
    const long long x = PyLong_AsLongLong(py::reinterpret_steal<py::object>(PyNumber_Index(item.ptr())).ptr());
    if (x == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw_invalid("{}[{}] does not fit 64 bits", what, i);
    }
    out.push_back(int64_t(x));
  }
  return out;
}

}  // namespace

std::vector<kvstream::Token> to_tokens(py::handle obj) {
  std::vector<kvstream::Token> out;
  const auto ints = ints_of(obj, "tokens");
  out.reserve(ints.size());
  for (size_t i = 0; i < ints.size(); ++i) {
    if (ints[i] < INT32_MIN || ints[i] > INT32_MAX) throw_invalid("tokens[{}] = {} does not fit int32", i, ints[i]);
    out.push_back(kvstream::Token(ints[i]));
  }
  return out;
}

std::vector<uint32_t> to_u32_list(py::handle obj, const char* what) {
  std::vector<uint32_t> out;
  const auto ints = ints_of(obj, what);
  for (size_t i = 0; i < ints.size(); ++i) {
    if (ints[i] < 0 || ints[i] > int64_t(UINT32_MAX)) throw_invalid("{}[{}] = {} is not a uint32", what, i, ints[i]);
    out.push_back(uint32_t(ints[i]));
  }
  return out;
}

HostKv packed_kv(py::handle array, const KvGeometry& g, bool writable) {
  const char* what = writable ? "fetch destination" : "kv";
  bool bf16 = false;
  const py::object arr = array_of(array, bf16, what);
  auto buf = export_buffer(arr, writable, what);
  const Py_buffer& v = buf->view;
  const DType dtype = kv_dtype(v, bf16, what);
  const auto s = shape_of(v);
  const Py_ssize_t L = g.layers, P = g.planes(), C = g.channels(), H = g.kv_heads, D = g.head_dim;
  const bool ok = (v.ndim == 4 && s[0] == L && s[1] == P && s[3] == C) ||
                  (v.ndim == 5 && s[0] == L && s[1] == P && s[3] == H && s[4] == D);
  if (!ok)
    throw_invalid("{}: shape {}, expected [{}, {}, tokens, {}] or [{}, {}, tokens, {}, {}] "
                  "([layers, K/V, tokens, kv_heads * head_dim] of the profile's model)",
                  what, s, L, P, C, L, P, H, D);
  check_contiguous(v, what);
  HostKv out;
  out.dtype = dtype;
  out.capacity_tokens = uint64_t(s[2]);
  out.view = unwrap(KvView::packed(v.buf, dtype, g, uint64_t(s[2])));
  out.buffers.push_back(std::move(buf));
  return out;
}

HostKv paged_kv(py::handle layers, py::handle block_table, uint32_t block_size, const KvGeometry& g, bool writable,
                uint64_t max_tokens) {
  if (!PySequence_Check(layers.ptr()) || PyUnicode_Check(layers.ptr()) || PyObject_CheckBuffer(layers.ptr()))
    throw_type("layers: expected a list of per-layer arrays, got {}", type_name(layers));
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(layers);
  if (seq.size() != g.layers)
    throw_invalid("layers: {} arrays, the profile's model has {} layers", seq.size(), g.layers);
  const Py_ssize_t P = g.planes(), C = g.channels(), H = g.kv_heads, D = g.head_dim;
  HostKv out;
  kvstream::PagedLayout lay;
  std::vector<Py_ssize_t> first_shape;
  for (size_t l = 0; l < seq.size(); ++l) {
    const std::string what = fmt::format("layers[{}]", l);
    bool bf16 = false;
    const py::object arr = array_of(seq[l], bf16, what.c_str());
    auto buf = export_buffer(arr, writable, what.c_str());
    const Py_buffer& v = buf->view;
    const DType dtype = kv_dtype(v, bf16, what.c_str());
    const auto s = shape_of(v);
    const bool ok = (v.ndim == 5 && s[0] == P && s[3] == H && s[4] == D) || (v.ndim == 4 && s[0] == P && s[3] == C);
    if (!ok)
      throw_invalid("{}: shape {}, expected [{}, num_blocks, block_size, {}, {}] (vLLM's layout: "
                    "[K/V, blocks, slots, kv_heads, head_dim])",
                    what, s, P, H, D);
    if (l == 0) {
      first_shape = s;
      out.dtype = dtype;
    } else if (s != first_shape || dtype != out.dtype) {
      throw_invalid("{}: shape {} {}, layers[0] is {} {}; every layer must match", what, s,
                    kvstream::dtype_name(dtype), first_shape, kvstream::dtype_name(out.dtype));
    }
    check_contiguous(v, what.c_str());
    lay.layer_base.push_back(v.buf);
    out.buffers.push_back(std::move(buf));
  }
  const uint64_t num_blocks = uint64_t(first_shape[1]), slots = uint64_t(first_shape[2]);
  if (block_size == 0) block_size = uint32_t(slots);
  if (block_size != slots)
    throw_invalid("block_size {}, but the layers' blocks hold {} tokens (shape {})", block_size, slots, first_shape);
  lay.block_size = block_size;
  lay.channel_stride = 1;
  lay.slot_stride = C;
  lay.block_stride = int64_t(slots) * C;
  lay.plane_stride = int64_t(num_blocks * slots) * C;
  lay.num_blocks = num_blocks;
  lay.block_table = to_u32_list(block_table, "block_table");
  for (size_t i = 0; i < lay.block_table.size(); ++i)
    if (lay.block_table[i] >= num_blocks)
      throw_invalid("block_table[{}] = {}: the layers have {} blocks", i, lay.block_table[i], num_blocks);
  if (lay.block_table.empty()) throw_invalid("block_table is empty");
  const uint64_t cap = uint64_t(lay.block_table.size()) * block_size;
  out.capacity_tokens = max_tokens > 0 ? std::min(cap, max_tokens) : cap;
  out.view = unwrap(KvView::paged(std::move(lay), out.dtype, g, out.capacity_tokens));
  return out;
}

}  // namespace kvspy
