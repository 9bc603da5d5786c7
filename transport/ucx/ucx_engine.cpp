// The engine's worker: created with its event fd and hello handler, slept on when a
// wait has spun long enough, and progressed by the background thread while the
// application is idle.
#include "transport/ucx/ucx_engine.hpp"

#include <poll.h>

#include <algorithm>

namespace kvstream::transport::ucx_detail {

using namespace std::chrono_literals;

Engine::~Engine() {
  stop_.store(true);
  if (worker) ucp_worker_signal(worker);
  if (bg_.joinable()) bg_.join();
  for (auto& r : stray_receives)
    if (r->op.done) r->op.release();  // the rest the worker frees as it goes
  if (worker) ucp_worker_destroy(worker);
  graveyard.clear();  // only now: no request can write into these any more
}

Result<std::shared_ptr<Engine>> Engine::create(const BackendConfig& config) {
  KVS_ASSIGN_OR_RETURN(auto ctx, Context::create(config.ucx, config.memory));
  auto e = std::make_shared<Engine>(std::move(ctx));
  e->peer_errors = config.ucx.peer_errors;
  e->stage_limit = size_t(config.ucx.stage_limit_bytes);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t st = ucp_worker_create(e->ctx->h, &wp, &e->worker);
  if (st != UCS_OK) {
    e->worker = nullptr;
    return make_status(StatusCode::unavailable, "ucx: ucp_worker_create: {}", ucs_status_string(st));
  }
  st = ucp_worker_get_efd(e->worker, &e->efd);
  if (st != UCS_OK) return make_status(StatusCode::unavailable, "ucx: ucp_worker_get_efd: {}", ucs_status_string(st));
  KVS_RETURN_IF_ERROR(set_hello_handler(*e));
  e->bg_ = std::thread([raw = e.get()] { raw->background(); });
  return e;
}

void Engine::sleep_on_event_fd(std::unique_lock<std::mutex>& lk, Deadline deadline, Clock::time_point now) {
  sleepers.fetch_add(1);
  const ucs_status_t st = ucp_worker_arm(worker);
  lk.unlock();
  if (st == UCS_OK) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{efd, POLLIN, 0};
    ::poll(&p, 1, int(std::clamp<int64_t>(left, 0, 10)));
  }
  sleepers.fetch_sub(1);
}

void Engine::background() {
  uint32_t seen = activity.load(std::memory_order_relaxed);
  while (!stop_.load()) {
    const uint32_t act = activity.load(std::memory_order_relaxed);
    if (waiters.load() > 0 || act != seen) {
      seen = act;
      // A caller is progressing the worker, or was active within the last
      // millisecond: only look for bodies to stage. try_lock: never make a caller
      // queue behind us.
      if (std::unique_lock lk(mu, std::try_to_lock); lk.owns_lock()) {
        const auto now = Clock::now();
        stage(now);
        sweep_when_due(now);
      }
      std::this_thread::sleep_for(1ms);
      continue;
    }
    std::unique_lock lk(mu);
    progress_locked();
    const auto now = Clock::now();
    const bool later = stage(now);
    sweep_when_due(now);
    const ucs_status_t st = ucp_worker_arm(worker);
    lk.unlock();
    if (st == UCS_ERR_BUSY) continue;
    pollfd p{efd, POLLIN, 0};
    ::poll(&p, 1, later ? 1 : 10);
  }
}

void Engine::sweep_when_due(Clock::time_point now) {
  // Strays cost nothing while they wait but memory, and memory UCX's pools took for
  // them stays with the process: a sweep on every pass of the background thread
  // (each millisecond while the application is busy, at most 10 ms apart otherwise)
  // keeps the pile small. Sweeping every 100 ms instead let a flood of 4 KiB strays
  // over loopback raise the node's resident size to 200-330 MiB for good. Where
  // nothing waits, a sweep is one probe of an empty queue. The look behind a kept
  // message (a probe per filter, each through the whole queue) once a second at most.
  if (!auto_sweep.load(std::memory_order_relaxed)) return;
  if (sweep_strays_locked(now >= next_look_behind_).looked_behind) next_look_behind_ = now + kLookBehindEvery;
}

}  // namespace kvstream::transport::ucx_detail
