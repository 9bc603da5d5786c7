// TLS settings for transport tests: test certificates made once per process under
// a temporary directory (tests/support/test_certs.hpp), removed when it exits.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kvstream/transport.hpp"

#include "kvstream/transport_config.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/test_certs.hpp"

namespace kvstream::transport::test_util {

/// The process's test certificates (made at the first call, removed at its exit).
inline const kvstream::testing::TestCerts& process_certs() {
  struct Made {
    kvstream::testing::TempDir dir{"kvs-tls"};
    kvstream::testing::TestCerts certs = kvstream::testing::make_test_certs(dir.string());
  };
  static const Made made;
  return made.certs;
}

/// A tcp config with TLS on both sides: the server certificate (localhost,
/// 127.0.0.1) serves as either side's, the test CA is trusted; kernel TLS as the
/// machine allows.
inline BackendConfig tls_tcp_config() {
  const auto& c = process_certs();
  BackendConfig cfg;
  cfg.name = "tcp";
  cfg.tcp.tls.enabled = true;
  cfg.tcp.tls.cert_file = c.server_cert;
  cfg.tcp.tls.key_file = c.server_key;
  cfg.tcp.tls.ca_file = c.ca;
  return cfg;
}

/// The conformance suite's parameter for tcp with TLS.
inline constexpr const char* kTlsTcp = "tcp_tls";

/// The config a conformance parameter names: a backend, or kTlsTcp.
inline BackendConfig config_for(const std::string& param) {
  if (param == kTlsTcp) return tls_tcp_config();
  BackendConfig cfg;
  cfg.name = param;
  return cfg;
}

/// The parameters of a suite run over every backend built: each backend, and tcp
/// again with TLS 1.3 (the same contract must hold through the record layer); "none"
/// where none is built, which keeps the suite instantiated (every test then fails
/// clearly).
inline std::vector<std::string> backend_params() {
  auto v = available_backends();
  if (std::find(v.begin(), v.end(), "tcp") != v.end()) v.push_back(kTlsTcp);
  if (v.empty()) v.push_back("none");
  return v;
}

}  // namespace kvstream::transport::test_util
