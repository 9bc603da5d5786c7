// kvstream errors as Python exceptions: kvstream.Error (an Exception) carries the
// kvstream::StatusCode as .code (int) and .code_name, and the message as .message;
// the common codes have subclasses that are also the matching builtin exception
// (InvalidArgument is a ValueError, TimedOut a TimeoutError, ...), so callers can
// catch either.
#include <array>

#include "bindings.hpp"

namespace kvspy {
namespace {

using kvstream::StatusCode;

// Exception classes, created once at import and kept for the interpreter's life.
PyObject* g_error = nullptr;
PyObject* g_invalid_type = nullptr;
std::array<PyObject*, size_t(kvstream::kLastStatusCode) + 1> g_by_code{};  // StatusCode -> class (g_error for the rest)

PyObject* new_class(py::module_& m, const char* name, const char* doc, py::tuple bases, StatusCode code) {
  const std::string qualified = std::string("kvstream.") + name;
  py::dict attrs;
  attrs["code"] = py::int_(int(code));
  attrs["code_name"] = py::str(std::string(kvstream::status_code_name(code)));
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), attrs.ptr());
  if (!cls) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // the module keeps a reference too
  return cls;
}

void raise(const StatusError& e) {
  const kvstream::Status& s = e.status;
  const size_t code = size_t(s.code());
  PyObject* cls = e.type_error ? g_invalid_type : (code < g_by_code.size() && g_by_code[code] ? g_by_code[code] : g_error);
  py::object inst = py::reinterpret_borrow<py::object>(cls)(py::str(s.to_string()));
  inst.attr("code") = py::int_(int(s.code()));
  inst.attr("code_name") = py::str(std::string(kvstream::status_code_name(s.code())));
  inst.attr("message") = py::str(s.message());
  PyErr_SetObject(cls, inst.ptr());
}

}  // namespace

void init_errors(py::module_& m) {
  py::enum_<StatusCode>(m, "StatusCode", "kvstream::StatusCode: why a call failed (stable values).")
      .value("ok", StatusCode::ok)
      .value("invalid_argument", StatusCode::invalid_argument)
      .value("out_of_range", StatusCode::out_of_range)
      .value("not_found", StatusCode::not_found)
      .value("already_exists", StatusCode::already_exists)
      .value("corrupt_data", StatusCode::corrupt_data)
      .value("unsupported", StatusCode::unsupported)
      .value("unavailable", StatusCode::unavailable)
      .value("timed_out", StatusCode::timed_out)
      .value("cancelled", StatusCode::cancelled)
      .value("permission_denied", StatusCode::permission_denied)
      .value("io_error", StatusCode::io_error)
      .value("resource_exhausted", StatusCode::resource_exhausted)
      .value("internal", StatusCode::internal)
      .value("no_space", StatusCode::no_space);

  auto builtin = [](const char* name) { return py::module_::import("builtins").attr(name); };
  const py::object exc = builtin("Exception");
  g_error = new_class(m, "Error",
                      "A kvstream call failed. .code is the kvstream::StatusCode (int), .code_name its name "
                      "(e.g. 'not_found'), .message the text without the code.",
                      py::make_tuple(exc), StatusCode::internal);
  const py::handle err(g_error);
  auto sub = [&](const char* name, const char* doc, StatusCode code, py::object also = py::none()) {
    py::tuple bases = also.is_none() ? py::make_tuple(err) : py::make_tuple(err, also);
    PyObject* cls = new_class(m, name, doc, bases, code);
    g_by_code[size_t(code)] = cls;
    return cls;
  };
  sub("NotFound", "Nothing stored (or no such setting) under that name (not_found).", StatusCode::not_found);
  PyObject* invalid = sub("InvalidArgument", "The call cannot accept an argument (invalid_argument); a ValueError.",
                          StatusCode::invalid_argument, builtin("ValueError"));
  sub("TimedOut", "The deadline passed first (timed_out); a TimeoutError.", StatusCode::timed_out,
      builtin("TimeoutError"));
  sub("Cancelled", "The caller cancelled (cancelled).", StatusCode::cancelled);
  sub("Unavailable", "A peer is down or unreachable (unavailable); a ConnectionError.", StatusCode::unavailable,
      builtin("ConnectionError"));
  sub("PermissionDenied", "Credentials missing or wrong (permission_denied); a PermissionError.",
      StatusCode::permission_denied, builtin("PermissionError"));
  sub("CorruptData", "Bytes failed a structural or checksum check (corrupt_data).", StatusCode::corrupt_data);
  sub("Unsupported", "The path asked for is not available here (unsupported).", StatusCode::unsupported);
  sub("NoSpace", "No room to store it: a disk or the tenant's quota is full (no_space); remove data first.",
      StatusCode::no_space);
  g_invalid_type = new_class(m, "InvalidType",
                             "An argument of the wrong kind or dtype (invalid_argument); an InvalidArgument "
                             "that is also a TypeError.",
                             py::make_tuple(py::handle(invalid), builtin("TypeError")), StatusCode::invalid_argument);

  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      raise(e);
    }
  });
}

}  // namespace kvspy
