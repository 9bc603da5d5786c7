// What the storage clients over a transport backend share: the node's client
// (storage/client.cpp) and the replicated client (cluster/replicated_client.hpp). The
// backend registers the caller's buffers and says where bodies may land; a put without
// parts or a version is put_parts, which each client implements.
#pragma once

#include <memory>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

class BackendClient : public Client {
 public:
  const transport::Capabilities* capabilities() const override { return &backend_->capabilities(); }

  Result<transport::MemoryRegion> register_memory(void* data, size_t size) override {
    return register_memory(data, size, transport::MemoryType::host);
  }
  Result<transport::MemoryRegion> register_memory(void* data, size_t size, transport::MemoryType type) override {
    return backend_->register_memory(data, size, type);
  }

  Status put(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
             transport::Deadline deadline, const transport::CancelToken& cancel) override {
    return put_parts(context, chunk, level, bytes, {}, 0, deadline, cancel);
  }
  Status put_versioned(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                       uint64_t version, transport::Deadline deadline, const transport::CancelToken& cancel) override {
    return put_parts(context, chunk, level, bytes, {}, version, deadline, cancel);
  }

 protected:
  explicit BackendClient(std::shared_ptr<transport::Backend> backend) : backend_(std::move(backend)) {}

  // A base's member: it outlives every connection and registration of the client
  // built on it (the derived class's members go first).
  const std::shared_ptr<transport::Backend> backend_;
};

}  // namespace kvstream::storage
