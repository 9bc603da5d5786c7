"""kvstream: remote KV-cache streaming for LLM serving, from Python.

A runtime stores the KV cache of a prompt's token prefix once (``KvStore.put``) and
any later prompt that shares the prefix finds it (``lookup``) and streams it back into
its own memory (``fetch`` into a packed array, ``fetch_paged`` into a vLLM-style paged
cache), each chunk at the compression level that meets the fetch's deadline within a
quality bound. The calls are the C++ library's (include/kvstream/kv_store.hpp); they
release the GIL while they block.

    import kvstream
    cfg = kvstream.StoreConfig({"storage.address": "127.0.0.1:7471", "storage.namespace": "ns",
                                "storage.secret": secret, "codec.profile": "model.kvsprofile",
                                "codec.model_id": "my-model", "codec.chunk_tokens": 64})
    with kvstream.KvStore.open(cfg) as store:
        store.put(tokens, kv)                        # numpy or torch, [layers, 2, T, kv_heads*head_dim]
        n = store.lookup(new_prompt)                 # leading tokens stored
        report = store.fetch(new_prompt, dest, level=0).wait()

Memory: KV arrays are numpy arrays or torch CPU tensors; torch tensors are taken
through ``Tensor.numpy()``, which shares the tensor's memory, so the KV is read from
and fetched into the caller's memory without copies. float32 and float16 (and torch
bfloat16) elements; C-contiguous.

Errors are ``kvstream.Error`` with ``.code`` (the kvstream::StatusCode value) and
``.code_name``; the common codes have subclasses that are also the builtin exception
of the kind (``InvalidArgument`` is a ``ValueError``, ``TimedOut`` a ``TimeoutError``,
``Unavailable`` a ``ConnectionError``, ``PermissionDenied`` a ``PermissionError``).
"""
from __future__ import annotations

from ._kvstream import (  # noqa: F401
    Cancelled,
    CorruptData,
    Error,
    Fetch,
    InvalidArgument,
    InvalidType,
    KvStore,
    NoSpace,
    NotFound,
    PermissionDenied,
    Server,
    StatusCode,
    StoreConfig,
    TimedOut,
    Unavailable,
    Unsupported,
    __version__,
    set_log_level,
    settings,
)
from ._types import (  # noqa: F401
    ChunkDecision,
    ChunkReport,
    EvictReport,
    FetchPlan,
    FetchReport,
    Geometry,
    LevelInfo,
    PutReport,
    Setting,
)

__all__ = [
    "KvStore", "Fetch", "StoreConfig", "Server", "settings", "set_log_level", "StatusCode",
    "Error", "NotFound", "InvalidArgument", "InvalidType", "TimedOut", "Cancelled", "Unavailable",
    "PermissionDenied", "CorruptData", "Unsupported", "NoSpace",
    "PutReport", "FetchReport", "ChunkReport", "FetchPlan", "ChunkDecision", "EvictReport", "Geometry",
    "LevelInfo", "Setting", "__version__",
]
