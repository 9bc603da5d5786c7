// Settings tables. Every configurable part of kvstream (the front door's StoreConfig,
// a transport's BackendConfig) keeps its settings in one table where each row has a
// name, a default and a meaning, as UCX's config tables do; set/get/describe walk it.
#pragma once

#include <string>
#include <string_view>

namespace kvstream {

/// One row of a settings table.
struct SettingInfo {
  std::string_view name;       ///< e.g. "storage.address"
  std::string_view doc;        ///< what it means
  std::string default_value;   ///< as text
  std::string env;             ///< its environment variable (empty where none is read)
};

}  // namespace kvstream
