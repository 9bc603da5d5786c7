"""A KV connector with the method shape of vLLM's KVConnectorBase_V1
(vllm/distributed/kv_transfer/kv_connector/v1/base.py), backed by kvstream.

vLLM splits a connector in two roles. The *scheduler* side decides, per request, how
many prompt tokens can come from the external cache and what each step must load and
save; the *worker* side moves the KV between the external cache and the paged KV
buffers during the forward pass. This module keeps vLLM's method names, arguments and
return shapes, but works on small dataclasses of its own (Request, KVCacheBlocks,
SchedulerOutput, ForwardContext) instead of importing vLLM, so the example runs with
the PyTorch stories260K runtime (tinyllama_torch.py) alone.

    conn = KvStreamConnector(store, block_size=16)            # one object plays both roles here
    n, load_async = conn.get_num_new_matched_tokens(req, 0)    # scheduler: lookup
    conn.update_state_after_alloc(req, KVCacheBlocks(blocks), n)
    meta = conn.build_connector_meta(SchedulerOutput([req]))
    conn.bind_connector_metadata(meta)                         # worker, before the forward pass
    conn.start_load_kv(ForwardContext(kv_caches))              # starts KvStore.fetch_paged
    conn.wait_for_layer_load("layers.0")                       # before layer 0's attention
    ... forward pass; per layer: conn.save_kv_layer(name, kv_layer, attn_metadata)
    conn.wait_for_save()                                       # puts the new chunks
    conn.clear_connector_metadata()

What differs from a layer-pipelined connector, honestly: kvstream fetches a context
chunk by chunk (a chunk is all layers of chunk_tokens tokens, coded together), not
layer by layer. So the first wait_for_layer_load() of a step waits for the whole fetch
and the later ones return at once; the fetch overlaps with nothing but the scheduler's
own work in between. Saving works the same way round: save_kv_layer() only records
the layer's paged buffer, and wait_for_save() stores the prompt's whole chunks (every
layer, read straight from the paged buffers by KvStore.put_paged) after the forward
pass, before those blocks can be reused.
"""
from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import kvstream

log = logging.getLogger("kvstream.connector")


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


# --- the stand-ins for vLLM's types ---------------------------------------------------------


@dataclass
class Request:
    """vllm.v1.request.Request, the fields a connector reads."""
    request_id: str
    prompt_token_ids: list[int]


@dataclass
class KVCacheBlocks:
    """vllm.v1.core.kv_cache_manager.KVCacheBlocks: the request's blocks, per KV cache group."""
    blocks: list[int]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (list(self.blocks),)


@dataclass
class NewRequestData:
    """vllm.v1.core.sched.output.NewRequestData: a request scheduled for the first time."""
    req_id: str
    prompt_token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int = 0


@dataclass
class SchedulerOutput:
    """vllm.v1.core.sched.output.SchedulerOutput, reduced to the new requests of a step."""
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)


@dataclass
class ForwardContext:
    """vllm.forward_context.ForwardContext: the paged KV buffer of each attention layer,
    [2, num_blocks, block_size, kv_heads, head_dim] (K then V), by layer name."""
    kv_caches: dict[str, Any]
    attn_metadata: Any = None


# --- connector metadata (scheduler -> worker) ----------------------------------------------


@dataclass
class LoadSpec:
    """Load positions [0, num_tokens) of the prompt into its blocks."""
    request_id: str
    token_ids: list[int]
    block_ids: list[int]
    num_tokens: int           #: locally computed + external tokens: the prefix that must be in the blocks
    num_external_tokens: int  #: of those, the ones the connector promised


@dataclass
class SaveSpec:
    """Store the prompt's whole chunks from its blocks after the forward pass."""
    request_id: str
    token_ids: list[int]
    block_ids: list[int]


@dataclass
class KvStreamConnectorMetadata:
    """What the worker side does in this step (vLLM's KVConnectorMetadata)."""
    requests_to_load: list[LoadSpec] = field(default_factory=list)
    requests_to_save: list[SaveSpec] = field(default_factory=list)


@dataclass
class LoadResult:
    """How one request's load went (worker side; for the runtime and for reports)."""
    request_id: str
    loaded_tokens: int = 0          #: positions [0, loaded_tokens) now hold fetched KV
    seconds: float = 0.0            #: start_load_kv to the end of the fetch
    report: Optional[kvstream.FetchReport] = None
    error: Optional[kvstream.Error] = None  #: the fetch failed: the runtime recomputes from text


class KvStreamConnector:
    """kvstream as a vLLM v1 KV connector (scheduler and worker sides in one object).

    store:      an open kvstream.KvStore (its profile is the model's KV geometry).
    block_size: tokens per block of the paged KV cache.
    level:      a fixed level for every chunk (0: near-lossless); None: the adaptive
                chooser, against `fetch_deadline_s`, within policy.max_quality_loss_pct.
    fetch_deadline_s: the fetch's deadline (seconds after start_load_kv); for the
                adaptive chooser it is the time it plans the levels against. A fetch
                that misses it fails with TimedOut and its blocks are reported by
                get_block_ids_with_load_errors(), so the runtime recomputes them.
    save:       store the whole chunks of prompts whose prefix is not fully stored.
    """

    def __init__(self, store: kvstream.KvStore, block_size: int, level: Optional[int] = None,
                 fetch_deadline_s: float = 30.0, save: bool = True,
                 role: KVConnectorRole = KVConnectorRole.SCHEDULER) -> None:
        self.store = store
        self.block_size = block_size
        self.level = level
        self.fetch_deadline_s = fetch_deadline_s
        self.save = save
        self.role = role
        self.chunk_tokens = store.chunk_tokens
        # Scheduler side.
        self._matched: dict[str, int] = {}       # request id -> stored prefix (tokens) from the last lookup
        self._need_load: dict[str, tuple[Request, int]] = {}  # request id -> (request, num_external_tokens)
        self._need_save: dict[str, Request] = {}
        # Worker side.
        self._meta: Optional[KvStreamConnectorMetadata] = None
        self._kv_caches: dict[str, Any] = {}
        self._loading: list[tuple[LoadSpec, kvstream.Fetch, float]] = []
        self._saved_layers: dict[str, Any] = {}
        self._load_errors: set[int] = set()
        self.load_results: dict[str, LoadResult] = {}
        self.put_reports: dict[str, kvstream.PutReport] = {}
        self.save_errors: dict[str, kvstream.Error] = {}  # request id -> why its chunks were not stored

    # ============================== scheduler side ==============================

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens beyond `num_computed_tokens` whose KV the store holds: a lookup of the
        prompt, in whole chunks, never the whole prompt (vLLM must compute at least the
        last prompt token to sample from its logits). Side-effect free apart from
        remembering the lookup. The second element is False: the load happens inside
        the step (start_load_kv / wait_for_layer_load), not between steps."""
        prompt = request.prompt_token_ids
        if len(prompt) < 2:
            return 0, False
        stored = self.store.lookup(prompt[:len(prompt) - 1])  # whole chunks inside the first len - 1 tokens
        self._matched[request.request_id] = stored
        return max(0, stored - num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """Blocks are allocated: remember to load the external tokens into them (decided
        on num_external_tokens, as vLLM asks, not on whether blocks is empty)."""
        if num_external_tokens > 0:
            self._need_load[request.request_id] = (request, num_external_tokens)
        whole = len(request.prompt_token_ids) // self.chunk_tokens * self.chunk_tokens
        if self.save and whole > self._matched.get(request.request_id, 0):
            self._need_save[request.request_id] = request

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvStreamConnectorMetadata:
        """What the workers load and save this step, for the newly scheduled requests;
        resets the per-step state."""
        meta = KvStreamConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            blocks = list(new.block_ids[0])
            if new.req_id in self._need_load:
                _, external = self._need_load[new.req_id]
                meta.requests_to_load.append(LoadSpec(new.req_id, list(new.prompt_token_ids), blocks,
                                                      new.num_computed_tokens + external, external))
            if new.req_id in self._need_save:
                meta.requests_to_save.append(SaveSpec(new.req_id, list(new.prompt_token_ids), blocks))
        self._need_load.clear()
        self._need_save.clear()
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, Optional[dict]]:
        """The request is done: its blocks may be freed at once (saves finish inside the step)."""
        self._matched.pop(request.request_id, None)
        return False, None

    # ============================== worker side ==============================

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """The paged KV buffers by layer name, in layer order."""
        self._kv_caches = dict(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KvStreamConnectorMetadata) -> None:
        self._meta = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._meta = None

    def _layers(self, forward_context: Optional[ForwardContext]) -> list[Any]:
        caches = forward_context.kv_caches if forward_context is not None else self._kv_caches
        return list(caches.values())

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Starts one KvStore.fetch_paged per request to load, straight into its blocks
        of the paged buffers (all layers), positions [0, num_tokens)."""
        assert self._meta is not None, "bind_connector_metadata first"
        layers = self._layers(forward_context)
        self._load_errors.clear()
        for spec in self._meta.requests_to_load:
            start = time.perf_counter()
            try:
                fetch = self.store.fetch_paged(spec.token_ids, layers, spec.block_ids, self.block_size,
                                               timeout=self.fetch_deadline_s, level=self.level,
                                               max_tokens=spec.num_tokens)
            except kvstream.Error as e:
                self._failed(spec, e, time.perf_counter() - start)
                continue
            self._loading.append((spec, fetch, start))

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until `layer_name`'s KV is in the paged buffers. kvstream moves whole
        chunks (all layers together), so the first call waits for every fetch started
        by start_load_kv and later calls return at once."""
        while self._loading:
            spec, fetch, start = self._loading.pop(0)
            try:
                report = fetch.wait()
            except kvstream.Error as e:
                self._failed(spec, e, time.perf_counter() - start)
                continue
            # Chunks the chooser sent as text (recompute ranges) are not in the blocks:
            # the prefix up to the first of them is.
            loaded = min([b for b, _ in report.recompute] + [report.tokens, spec.num_tokens])
            self.load_results[spec.request_id] = LoadResult(spec.request_id, loaded, time.perf_counter() - start,
                                                            report)
            self._mark_errors(spec, loaded)

    def _failed(self, spec: LoadSpec, error: kvstream.Error, seconds: float) -> None:
        self.load_results[spec.request_id] = LoadResult(spec.request_id, 0, seconds, None, error)
        self._mark_errors(spec, 0)

    def _mark_errors(self, spec: LoadSpec, loaded: int) -> None:
        # Blocks holding positions [loaded, num_tokens) were promised and did not come.
        first = loaded // self.block_size
        last = -(-spec.num_tokens // self.block_size)
        self._load_errors.update(spec.block_ids[first:last])

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose promised KV failed to load (vLLM recomputes from them on)."""
        return set(self._load_errors)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """Records the layer's paged buffer (nothing is copied); the store happens in
        wait_for_save(), once every layer of the chunks is computed."""
        self._saved_layers[layer_name] = kv_layer

    def wait_for_save(self) -> None:
        """Stores the whole chunks of each request to save (KvStore.put_paged reads them
        from the blocks; chunks found stored, a shared prefix, are skipped). A store that
        fails (full: NoSpace, unless eviction.when_full makes room; down: Unavailable)
        never fails the request: its KV is only not kept, the error is logged and kept
        in save_errors, and a later request recomputes what was not stored."""
        assert self._meta is not None, "bind_connector_metadata first"
        if self._meta.requests_to_save:
            layers = [self._saved_layers[name] for name in self._kv_caches] if self._kv_caches else \
                list(self._saved_layers.values())
            for spec in self._meta.requests_to_save:
                try:
                    self.put_reports[spec.request_id] = self.store.put_paged(spec.token_ids, layers,
                                                                             spec.block_ids, self.block_size)
                except kvstream.Error as e:
                    log.warning("request %s: its KV was not stored: %s", spec.request_id, e)
                    self.save_errors[spec.request_id] = e
        self._saved_layers.clear()
