"""The value types kvstream's calls return: frozen dataclasses (and one NamedTuple),
built by the extension module from the C++ results (kvstream/kv_store.hpp)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Tuple


class Setting(NamedTuple):
    """One row of the settings table (kvstream.settings())."""
    name: str     #: e.g. "storage.address"
    default: str  #: the default value as text
    env: str      #: its environment variable, e.g. "KVSTREAM_STORAGE_ADDRESS"
    doc: str      #: what it means


@dataclass(frozen=True)
class Geometry:
    """The shape of a model's KV cache (the codec profile's)."""
    layers: int
    kv_heads: int
    head_dim: int
    q_heads: int
    kind: str       #: "mha", "gqa" or "mla"
    planes: int     #: 2 (K and V), or 1 for MLA's latent
    channels: int   #: kv_heads * head_dim

    def packed_shape(self, tokens: int) -> Tuple[int, int, int, int]:
        """Shape of a packed KV array of `tokens` tokens: [layers, planes, tokens, channels]."""
        return (self.layers, self.planes, tokens, self.channels)

    def paged_shape(self, num_blocks: int, block_size: int) -> Tuple[int, int, int, int, int]:
        """Shape of one layer of a vLLM-style paged cache: [planes, blocks, block_size, kv_heads, head_dim]."""
        return (self.planes, num_blocks, block_size, self.kv_heads, self.head_dim)


@dataclass(frozen=True)
class LevelInfo:
    """One level of the codec profile."""
    level: int
    step: float
    bits_per_element: float
    ppl_increase_pct: float  #: measured perplexity increase (%), -1 when not measured
    kl_nats: float           #: measured KL divergence per token, -1 when not measured


@dataclass(frozen=True)
class PutReport:
    """What KvStore.put did."""
    chunks: int          #: whole chunks in the tokens given
    already_stored: int  #: of those, found stored (a shared prefix) and not encoded again
    bytes: int           #: encoded bytes written (every level)
    tokens: int          #: tokens covered by stored chunks after the put (whole chunks)
    evicted_chunks: int = 0  #: chunks removed to make room (eviction.when_full)
    evicted_bytes: int = 0   #: their bytes


@dataclass(frozen=True)
class ChunkDecision:
    """What a fetch does (or would do) with one chunk."""
    action: str  #: "fetch" or "recompute" (sent as text: the runtime prefills it)
    level: int


@dataclass(frozen=True)
class ChunkReport:
    """One chunk of a finished fetch."""
    chunk: int
    action: str            #: "fetch" or "recompute"
    level: int
    bytes: int             #: encoded bytes fetched
    wire_seconds: float    #: request sent to bytes landed (0 when it never went out)
    decode_seconds: float  #: decoding into the destination
    status: str            #: "ok", or the code name of why this chunk failed
    message: str = ""      #: the failure's message


@dataclass(frozen=True)
class FetchReport:
    """The outcome of a fetch (Fetch.wait)."""
    tokens: int                          #: tokens [0, tokens) handled: in the destination or in `recompute`
    recompute: List[Tuple[int, int]]     #: [begin, end) ranges chosen as text: the runtime prefills them
    bytes: int                           #: encoded bytes fetched
    mean_quality_loss_pct: float         #: mean over fetched chunks of their level's perplexity increase
    max_quality_loss_pct: float
    chunks: List[ChunkReport] = field(default_factory=list)

    @property
    def fetched_tokens(self) -> int:
        """Tokens whose KV is in the destination (tokens minus those to recompute)."""
        return self.tokens - sum(e - b for b, e in self.recompute)

    @property
    def levels(self) -> List[int]:
        """The level of each fetched chunk, in chunk order."""
        return [c.level for c in sorted(self.chunks, key=lambda c: c.chunk) if c.action == "fetch"]


@dataclass(frozen=True)
class FetchPlan:
    """What a fetch is predicted to do if started now (KvStore.plan)."""
    tokens: int                  #: tokens the fetch would cover (whole stored chunks)
    fits: bool                   #: predicted done by the deadline
    predicted_seconds: float     #: until the last chunk is in memory, queueing included
    mean_quality_loss_pct: float
    recompute_chunks: int
    decisions: List[ChunkDecision] = field(default_factory=list)


@dataclass(frozen=True)
class EvictReport:
    """What KvStore.evict removed."""
    chunks_removed: int
    bytes_removed: int
    bytes_kept: int
