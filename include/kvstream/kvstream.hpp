// kvstream: remote KV-cache reuse for LLM serving. The one header a runtime needs:
// the front door (KvStore and its StoreConfig) and everything its calls take and
// return. The parts below it (codec, storage, pipeline, policy) have headers of their
// own for callers that assemble them by hand.
#pragma once

#include "kvstream/codec.hpp"
#include "kvstream/dtype.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/kv_store.hpp"
#include "kvstream/log.hpp"
#include "kvstream/pipeline.hpp"
#include "kvstream/status.hpp"
#include "kvstream/storage.hpp"
#include "kvstream/store_config.hpp"
#include "kvstream/transport.hpp"
