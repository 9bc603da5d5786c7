// What both Redis clients (single server and cluster) do the same way around their
// commands: argument checks, host-memory registration, completing a get into the
// caller's buffer, and reading transaction and set replies. Internal.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "kvstream/redis_storage.hpp"
#include "kvstream/storage.hpp"
#include "storage/redis/redis_conn.hpp"
#include "storage/redis/redis_job_queue.hpp"
#include "storage/redis/redis_value.hpp"

namespace kvstream::redis::detail {

/// Host memory only, no one-sided reads: values are copied out of hiredis' replies.
const transport::Capabilities& redis_capabilities(bool cluster);
/// Any host buffer (nothing to register with a server); other memory: unsupported.
Result<transport::MemoryRegion> register_host_memory(void* data, size_t size, transport::MemoryType type);

/// What both Redis clients answer alike: their capabilities, host-memory
/// registration (values travel through hiredis' buffers in host memory and a get is
/// copied into the destination, so only host destinations are possible), and put as
/// a put without parts.
class RedisClientBase : public storage::Client {
 public:
  explicit RedisClientBase(bool cluster) : cluster_(cluster) {}
  const transport::Capabilities* capabilities() const override { return &redis_capabilities(cluster_); }
  Result<transport::MemoryRegion> register_memory(void* data, size_t size, transport::MemoryType type) override {
    return register_host_memory(data, size, type);
  }
  Result<transport::MemoryRegion> register_memory(void* data, size_t size) override {
    return register_host_memory(data, size, transport::MemoryType::host);
  }
  Status put(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
             transport::Deadline deadline, const transport::CancelToken& cancel) override {
    return put_parts(context, chunk, level, bytes, {}, 0, deadline, cancel);
  }
  using storage::Client::put_parts;

  /// The checks both clients make of a RedisConfig (namespace, connections 1..64).
  static Status check_common(const RedisConfig& cfg);

 private:
  bool cluster_;
};

/// What both clients build once from a RedisConfig and share between connections.
struct ClientSecurity {
  std::shared_ptr<const security::TlsContext> tls;  ///< null: in clear
  std::shared_ptr<const Sealer> sealer;             ///< null: values in clear
  /// For the client's log line: ", TLS (...)", ", values sealed (...)", or "".
  std::string describe() const;
};
/// Errors: invalid_argument (TLS files, TLS with a Unix socket address), those of
/// KeyRing::load.
Result<ClientSecurity> make_security(const RedisConfig& cfg);

Status validate_put(const std::string& context, uint32_t level, std::span<const std::byte> bytes,
                    std::span<const storage::ObjectPart> parts);
Status validate_get(const std::string& context, uint32_t level, const transport::MemoryRegion& dest, size_t offset,
                    size_t capacity);
Status validate_get_range(const std::string& context, uint32_t level, uint64_t offset, uint64_t length,
                          const transport::MemoryRegion& dest, size_t dest_offset);

/// The value key's block-sum key.
std::string blocks_key(const std::string& chunk_key);

/// Every reply of a MULTI ... EXEC batch is not an error and EXEC returned `n`
/// results, none an error. Errors: unavailable (refused, or the transaction aborted).
Status check_exec(const std::vector<Reply>& rs, size_t n, std::string_view what);
/// The members of a set reply, sorted.
Result<std::vector<std::string>> string_set(const redisReply* r, std::string_view what);

/// Completes a get: copies `payload` into dest[offset, ...) and reports its size when
/// this call still owns the job (else the caller's buffer is no longer ours), or
/// reports the error. Releases `dest` either way.
template <typename Worker>
void deliver(Job<Worker>& j, const storage::GetCallback& done, Result<std::span<const std::byte>> payload,
             transport::MemoryRegion& dest, size_t offset, size_t capacity);

/// Copies a checked payload into dest[offset, ...).
size_t copy_out(std::span<const std::byte> payload, transport::MemoryRegion& dest, size_t offset);

template <typename Worker>
void deliver(Job<Worker>& j, const storage::GetCallback& done, Result<std::span<const std::byte>> payload,
             transport::MemoryRegion& dest, size_t offset, size_t capacity) {
  Result<size_t> out = payload.status();
  if (payload.ok() && payload->size() > capacity)
    out = make_status(StatusCode::out_of_range, "chunk of {} bytes, buffer of {}", payload->size(), capacity);
  else if (payload.ok() && j.claim()) {
    out = copy_out(*payload, dest, offset);
    dest = {};
    done(std::move(out));
    return;
  } else if (payload.ok()) {
    dest = {};
    return;  // completed already (deadline, cancel): the buffer is no longer ours
  }
  dest = {};
  if (j.claim()) done(std::move(out));
}

/// Queues a verified get of `key` into dest[offset, offset + capacity): on a worker,
/// `runner_for(worker, job, key)` gives the Runner that reaches the key's server.
/// `sealer` (null: values in clear) outlives the queue.
template <typename Worker, typename RunnerFor>
void queue_get(JobQueue<Worker>& q, std::string key, transport::MemoryRegion dest, size_t offset, size_t capacity,
               transport::Deadline deadline, const transport::CancelToken& cancel, storage::GetCallback done,
               RunnerFor runner_for, const Sealer* sealer) {
  auto job = std::make_shared<Job<Worker>>();
  job->deadline = deadline, job->cancel = cancel;
  auto shared_done = std::make_shared<storage::GetCallback>(std::move(done));
  job->fail = [shared_done](Status s) { (*shared_done)(std::move(s)); };
  job->run = [shared_done, key = std::move(key), dest = std::move(dest), offset, capacity, runner_for, sealer](
                 Worker& w, Job<Worker>& j) mutable {
    auto rs = runner_for(w, j, key)({{"GET", key}});
    Result<std::span<const std::byte>> payload =
        rs.ok() ? verified_payload(key, (*rs)[0].get(), sealer) : rs.status();
    deliver(j, *shared_done, std::move(payload), dest, offset, capacity);
  };
  q.enqueue(std::move(job));
}

/// Queues a range read (read_range) of `key` into dest[dest_offset, +length).
template <typename Worker, typename RunnerFor>
void queue_get_range(JobQueue<Worker>& q, std::string key, uint64_t offset, uint64_t length,
                     transport::MemoryRegion dest, size_t dest_offset, transport::Deadline deadline,
                     const transport::CancelToken& cancel, storage::GetCallback done, RunnerFor runner_for,
                     const Sealer* sealer) {
  auto job = std::make_shared<Job<Worker>>();
  job->deadline = deadline, job->cancel = cancel;
  auto shared_done = std::make_shared<storage::GetCallback>(std::move(done));
  job->fail = [shared_done](Status s) { (*shared_done)(std::move(s)); };
  job->run = [shared_done, key = std::move(key), dest = std::move(dest), offset, length, dest_offset, runner_for,
               sealer](Worker& w, Job<Worker>& j) mutable {
    Result<RangeRead> got = read_range(runner_for(w, j, key), key, blocks_key(key), offset, length, sealer);
    deliver(j, *shared_done, got.ok() ? Result<std::span<const std::byte>>(got->bytes) : got.status(), dest,
            dest_offset, length);
  };
  q.enqueue(std::move(job));
}

}  // namespace kvstream::redis::detail
