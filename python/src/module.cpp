// kvstream._kvstream: the extension module under the `kvstream` package
// (python/kvstream/__init__.py re-exports it). One file per part: errors, arrays
// (tokens and KV memory), config, reports, store, fetch, server.
#include "bindings.hpp"

PYBIND11_MODULE(_kvstream, m) {
  m.doc() = "kvstream's C++ library (KvStore, StoreConfig, Server) for Python; use the `kvstream` package.";
  m.attr("__version__") = KVSTREAM_VERSION;
  kvspy::init_errors(m);  // first: the others' errors translate through it
  kvspy::init_config(m);
  kvspy::init_fetch(m);
  kvspy::init_store(m);
  kvspy::init_server(m);
  m.def(
      "set_log_level",
      [](const std::string& level) { kvstream::set_log_level(kvspy::unwrap(kvstream::parse_log_level(level))); },
      py::arg("level"),
      "set_log_level(level): kvstream's log level: 'trace', 'debug', 'info' (default; log.level of a StoreConfig), "
      "'warn', 'error' or 'off'.");
}
