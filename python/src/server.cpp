// kvstream.Server: a storage node in this process (storage::Server), for tests,
// examples and single-host setups. Clients reach it at .address.
#include "bindings.hpp"

namespace kvspy {
namespace {

namespace storage = kvstream::storage;

class Server {
 public:
  explicit Server(std::unique_ptr<storage::Server> s, std::string directory)
      : s_(std::move(s)), address_(s_->address()), directory_(std::move(directory)) {}
  ~Server() { stop(); }
  void stop() {
    if (!s_) return;
    std::unique_ptr<storage::Server> s = std::move(s_);
    py::gil_scoped_release nogil;  // joins the node's threads
    s->stop();
    s.reset();
  }
  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] const std::string& directory() const { return directory_; }
  [[nodiscard]] bool running() const { return bool(s_); }
  py::dict counters() const {
    if (!s_) throw_invalid("the server is stopped");
    const auto c = s_->counters();
    py::dict d;
    d["requests"] = c.requests;
    d["errors"] = c.errors;
    d["bytes_out"] = c.bytes_out;
    d["bytes_in"] = c.bytes_in;
    d["cache_hits"] = c.cache_hits;
    d["auth_failures"] = c.auth_failures;
    d["refused_connections"] = c.refused_connections;
    d["budget_refusals"] = c.budget_refusals;
    d["budget_peak_bytes"] = c.budget_peak_bytes;
    d["quota_refusals"] = c.quota_refusals;
    d["use_marks_raised"] = c.use_marks_raised;
    d["removes_remembered"] = c.removes_remembered;
    d["fenced_gets"] = c.fenced_gets;
    if (c.transport_peer_entries) d["transport_peer_entries"] = *c.transport_peer_entries;
    if (c.transport_strays) {
      d["transport_strays_dropped"] = c.transport_strays->messages;
      d["transport_stray_bytes"] = c.transport_strays->bytes;
    }
    return d;
  }
  py::dict namespace_usage() const {
    if (!s_) throw_invalid("the server is stopped");
    py::dict d;
    for (const auto& u : s_->namespace_usage()) {
      py::dict e;
      e["stored_bytes"] = u.stored_bytes;
      e["quota_bytes"] = u.quota_bytes;
      d[py::str(u.name_space)] = e;
    }
    return d;
  }
  void set_namespace_quotas(uint64_t default_bytes, const std::map<std::string, uint64_t>& per_namespace) {
    if (!s_) throw_invalid("the server is stopped");
    s_->set_namespace_quotas(default_bytes, per_namespace);
  }

 private:
  std::unique_ptr<storage::Server> s_;
  std::string address_, directory_;
};

}  // namespace

void init_server(py::module_& m) {
  using namespace pybind11::literals;
  py::class_<Server>(m, "Server", R"doc(
A kvstream storage node running in this process (what kvstream-server runs), for
tests, examples and single-host use. Chunks live in `directory`; only the namespaces
in `secrets` exist, each reachable with its secret.

    with kvstream.Server.start(tmpdir, {"demo": secret}) as node:
        cfg = kvstream.StoreConfig({"storage.address": node.address,
                                    "storage.namespace": "demo", "storage.secret": secret, ...})
)doc")
      .def_static(
          "start",
          [](const std::string& directory, const std::map<std::string, std::string>& secrets,
             const std::string& address, const std::string& backend, uint64_t cache_bytes,
             uint64_t memory_budget_bytes, uint64_t namespace_quota_bytes) {
            storage::ServerConfig c;
            c.directory = directory;
            c.secrets = secrets;
            c.address = address;
            c.backend.name = backend;
            c.cache_bytes = cache_bytes;
            c.memory_budget_bytes = memory_budget_bytes;
            c.default_namespace_quota_bytes = namespace_quota_bytes;
            kvstream::Result<std::unique_ptr<storage::Server>> r =
                kvstream::Status(kvstream::StatusCode::internal, "not started");
            {
              py::gil_scoped_release nogil;
              r = storage::Server::start(c);
            }
            return std::make_unique<Server>(unwrap(std::move(r)), directory);
          },
          "directory"_a, "secrets"_a, "address"_a = "127.0.0.1:0", "backend"_a = "tcp",
          "cache_bytes"_a = uint64_t(256) << 20, "memory_budget_bytes"_a = 0, "namespace_quota_bytes"_a = 0,
          "start(directory, secrets, address='127.0.0.1:0', backend='tcp', cache_bytes=256 MiB, "
          "memory_budget_bytes=0, namespace_quota_bytes=0) -> Server: starts listening (port 0: any free port; "
          "see .address). `secrets` maps namespace -> secret; namespace_quota_bytes bounds what each namespace "
          "stores (0: no bound; a put past it raises NoSpace). Raises InvalidArgument, Error (io_error) for the "
          "directory, the backend's errors.")
      .def_property_readonly("address", &Server::address, "host:port clients connect to (the actual port).")
      .def_property_readonly("directory", &Server::directory)
      .def_property_readonly("running", &Server::running)
      .def("counters", &Server::counters, "counters() -> dict: requests, errors, bytes in and out, cache hits, ...")
      .def("namespace_usage", &Server::namespace_usage,
           "namespace_usage() -> dict: namespace -> {'stored_bytes', 'quota_bytes' (0: no bound)}, for every "
           "namespace the node serves.")
      .def("set_namespace_quotas", &Server::set_namespace_quotas, "default_bytes"_a, "per_namespace"_a = py::dict(),
           "set_namespace_quotas(default_bytes, per_namespace={}): the bytes each namespace may store (0: no "
           "bound), per namespace where listed; puts under way keep their claim, nothing stored is removed.")
      .def("stop", &Server::stop, "stop(): stops accepting, closes connections, waits for the node's threads.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Server& s, py::handle, py::handle, py::handle) {
        s.stop();
        return false;
      })
      .def("__repr__", [](const Server& s) {
        return fmt::format("kvstream.Server(address='{}', directory='{}'{})", s.address(), s.directory(),
                           s.running() ? "" : ", stopped");
      });
}

}  // namespace kvspy
