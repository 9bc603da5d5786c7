// kvstream.StoreConfig: the one configuration of KvStore.open, as the C++ table of
// named settings (store/store_config.cpp): set/get by name as text, describe,
// from_env, validate; and kvstream.settings(), the table itself.
#include "bindings.hpp"

namespace kvspy {
namespace {

using kvstream::StoreConfig;

std::string setting_text(const std::string& name, py::handle v) {
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  // Before int: a bool is one, and True must read "true", not "1".
  if (PyBool_Check(v.ptr())) return v.ptr() == Py_True ? "true" : "false";
  if (PyLong_Check(v.ptr())) return py::str(v).cast<std::string>();
  if (PyFloat_Check(v.ptr())) return py::repr(v).cast<std::string>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::string out;
    for (const auto item : v) {
      if (!out.empty()) out += ',';
      out += setting_text(name, item);
    }
    return out;
  }
  throw_type("setting {}: expected a str, bool, int, float or list, got {}", name, Py_TYPE(v.ptr())->tp_name);
}

void set_all(StoreConfig& c, py::handle mapping) {
  if (mapping.is_none()) return;
  if (!PyMapping_Check(mapping.ptr()) || py::isinstance<py::str>(mapping))
    throw_type("StoreConfig: expected a mapping of setting names to values, got {}", Py_TYPE(mapping.ptr())->tp_name);
  for (const auto item : py::reinterpret_borrow<py::object>(mapping).attr("items")()) {
    const auto kv = py::reinterpret_borrow<py::tuple>(item);
    const std::string name = py::str(kv[0]);
    check(c.set(name, setting_text(name, kv[1])));
  }
}

py::dict as_dict(const StoreConfig& c) {
  py::dict out;
  for (const auto& s : kvstream::store_settings()) {
    const std::string name(s.name);
    out[py::str(name)] = unwrap(c.get(name));
  }
  return out;
}

std::string repr(const StoreConfig& c) {
  const StoreConfig defaults;
  std::string out = "kvstream.StoreConfig({";
  bool first = true;
  for (const auto& s : kvstream::store_settings()) {
    std::string value = unwrap(c.get(s.name));
    if (value == unwrap(defaults.get(s.name))) continue;
    if (s.name == "storage.secret") value = "(set)";
    out += fmt::format("{}'{}': {}", first ? "" : ", ", s.name, py::repr(py::str(value)).cast<std::string>());
    first = false;
  }
  return out + "})";
}

}  // namespace

void init_config(py::module_& m) {
  py::class_<StoreConfig>(m, "StoreConfig", R"doc(
Everything KvStore.open needs: a table of named settings ("storage.address",
"codec.profile", ...), each with a default, an environment variable and a meaning
(kvstream.settings() lists them; describe() prints them with the values in force).

    cfg = kvstream.StoreConfig({"storage.address": "127.0.0.1:7471",
                                "codec.profile": "tinyllama.kvsprofile",
                                "codec.model_id": "stories260K"})
    cfg.set("policy.max_quality_loss_pct", 1.0)
    cfg["storage.secret"] = "..."

Values are given as text or as ints, floats and lists (joined with commas), and read
back as text. An unknown name raises kvstream.NotFound; a bad value InvalidArgument.
)doc")
      .def(py::init([](py::object settings, py::kwargs kwargs) {
             StoreConfig c;
             set_all(c, settings);
             set_all(c, kwargs);
             return c;
           }),
           py::arg("settings") = py::none(),
           "StoreConfig(settings=None, **kwargs): the defaults, then every name -> value of the mapping "
           "`settings` and of the keyword arguments (names with dots: StoreConfig(**{'storage.address': ...})).")
      .def(
          "set",
          [](StoreConfig& c, const std::string& name, py::object value) {
            if (value.is_none()) {
              check(c.set(name));  // "name=value"
              return;
            }
            check(c.set(name, setting_text(name, value)));
          },
          py::arg("name"), py::arg("value") = py::none(),
          "set(name, value): sets one setting (lists take comma-separated values); set('name=value') also works. "
          "Raises NotFound (no such setting) or InvalidArgument (bad value).")
      .def(
          "get", [](const StoreConfig& c, const std::string& name) { return unwrap(c.get(name)); }, py::arg("name"),
          "get(name) -> str: the value of a setting as text. Raises NotFound.")
      .def("__getitem__", [](const StoreConfig& c, const std::string& name) { return unwrap(c.get(name)); })
      .def("__setitem__", [](StoreConfig& c, const std::string& name, py::object value) {
        check(c.set(name, setting_text(name, value)));
      })
      .def("__contains__", [](const StoreConfig& c, const std::string& name) { return c.get(name).ok(); })
      .def("update", [](StoreConfig& c, py::object settings) { set_all(c, settings); }, py::arg("settings"),
           "update(mapping): set() for every name -> value of the mapping.")
      .def("as_dict", &as_dict, "as_dict() -> dict[str, str]: every setting's value as text (the secret included).")
      .def("describe", &StoreConfig::describe,
           "describe() -> str: every setting, one per entry: name, value in force, default, environment variable, "
           "meaning (the secret is shown only as set or not).")
      .def(
          "validate", [](const StoreConfig& c) { check(c.validate()); },
          "validate(): checks values and combinations (required fields, ranges); raises InvalidArgument.")
      .def_static(
          "from_env",
          [](const StoreConfig* base) { return unwrap(StoreConfig::from_env(base ? *base : StoreConfig{})); },
          py::arg("base") = nullptr,
          "from_env(base=None) -> StoreConfig: `base` (default: the defaults) with every setting whose environment "
          "variable is set (KVSTREAM_ + the name upper-cased, '.' as '_': KVSTREAM_STORAGE_ADDRESS) replaced by it. "
          "Raises InvalidArgument naming the variable.")
      .def("copy", [](const StoreConfig& c) { return StoreConfig(c); }, "copy() -> StoreConfig")
      .def("__copy__", [](const StoreConfig& c) { return StoreConfig(c); })
      .def("__deepcopy__", [](const StoreConfig& c, py::dict) { return StoreConfig(c); }, py::arg("memo"))
      .def("__eq__", [](const StoreConfig& a, const StoreConfig& b) { return as_dict(a).equal(as_dict(b)); },
           py::is_operator())
      .def("__repr__", &repr)
      .def(py::pickle([](const StoreConfig& c) { return as_dict(c); },
                      [](py::dict d) {
                        StoreConfig c;
                        set_all(c, d);
                        return c;
                      }));
  py::implicitly_convertible<py::dict, StoreConfig>();

  m.def("settings", &settings_list,
        "settings() -> list[Setting]: every setting of StoreConfig as (name, default, env, doc), in table order.");
}

}  // namespace kvspy
