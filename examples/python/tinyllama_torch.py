#!/usr/bin/env python3
"""A small PyTorch inference runtime for Karpathy's stories260K Llama-2 model with a
vLLM-style paged KV cache.

It reproduces the C++ reference runtime in examples/tinyllama/ (model.cpp,
tokenizer.cpp): RMSNorm with eps 1e-5, RoPE on interleaved pairs (2i, 2i+1) with
llama2.c's fp32 tables, grouped-query attention (query head h reads KV head
h // (n_heads // n_kv_heads)), SwiGLU, and the classifier tied to the token embedding.
K is stored in the cache AFTER RoPE, as in the C++ State and in kvstream's KV model.

The paged cache holds, per layer, one tensor [2, num_blocks, block_size, kv_heads,
head_size] (vLLM's flash-attention layout; plane 0 = K, plane 1 = V). A sequence owns
a block table; position p lives in block block_table[p // block_size], slot
p % block_size. gather_packed / scatter_packed convert to kvstream's packed layout
[layer][plane][token][channel], channel = kv_head * head_size + d, which is what
`kvstream-tinyllama dump-kv` writes and what a remote store returns.

Data: $KVSTREAM_TINYLLAMA or ../shared/data/tinyllama relative to the repository.
Run: python3 examples/python/tinyllama_torch.py --prompt "Once upon a time" --steps 40
"""
from __future__ import annotations

import argparse
import heapq
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence as Seq, Union

import numpy as np
import torch

BOS = 1
EOS = 2


def data_dir(explicit: Optional[str] = None) -> str:
    """The data directory: `explicit` if given, else $KVSTREAM_TINYLLAMA, else
    <repo>/../shared/data/tinyllama (computed from this file's location)."""
    if explicit:
        return explicit
    env = os.environ.get("KVSTREAM_TINYLLAMA")
    if env:
        return env
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.normpath(os.path.join(repo, "..", "shared", "data", "tinyllama"))


# ----------------------------------------------------------------------------------
# Tokenizer (llama2.c tokenizer.bin, SentencePiece BPE), a port of tokenizer.cpp.
# ----------------------------------------------------------------------------------
_BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{1,2})")


class Tokenizer:
    """Pieces are kept as bytes so byte fallback and odd UTF-8 behave as in C++."""

    def __init__(self, pieces: list[bytes], scores: list[float]) -> None:
        self.pieces = pieces
        self.scores = scores
        self.ids: dict[bytes, int] = {}
        for i, p in enumerate(pieces):
            self.ids.setdefault(p, i)  # first occurrence wins, as in C++

    @staticmethod
    def load(path: str) -> "Tokenizer":
        with open(path, "rb") as f:
            raw = f.read()
        if len(raw) < 4:
            raise ValueError(f"tokenizer '{path}': bad header")
        max_len = int(np.frombuffer(raw, "<i4", 1)[0])
        if max_len <= 0 or max_len > 1024:
            raise ValueError(f"tokenizer '{path}': bad header")
        pieces: list[bytes] = []
        scores: list[float] = []
        off = 4
        while off + 4 <= len(raw):  # records until the end of the file
            score = float(np.frombuffer(raw, "<f4", 1, off)[0])
            if off + 8 > len(raw):
                raise ValueError(f"tokenizer '{path}': bad record {len(pieces)}")
            n = int(np.frombuffer(raw, "<i4", 1, off + 4)[0])
            if n < 0 or n > max_len * 4 + 16 or off + 8 + n > len(raw):
                raise ValueError(f"tokenizer '{path}': bad record {len(pieces)}")
            pieces.append(raw[off + 8:off + 8 + n])
            scores.append(score)
            off += 8 + n
        if len(pieces) < 259:
            raise ValueError(f"tokenizer '{path}': {len(pieces)} pieces, fewer than 259")
        return Tokenizer(pieces, scores)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def _encode_segment(self, text: bytes, out: list[int]) -> None:
        # Symbols: UTF-8 characters in the vocabulary, else one byte token per byte.
        ids: list[int] = []
        strs: list[bytes] = []
        i = 0
        while i < len(text):
            n = 1
            while i + n < len(text) and n < 4 and (text[i + n] & 0xC0) == 0x80:
                n += 1
            ch = text[i:i + n]
            if ch in self.ids:
                ids.append(self.ids[ch])
                strs.append(ch)
            else:  # byte tokens carry their "<0xNN>" piece, so they never merge
                for b in ch:
                    ids.append(b + 3)
                    strs.append(self.pieces[b + 3])
            i += n
        count = len(ids)
        prev = [k - 1 for k in range(count)]
        nxt = [k + 1 if k + 1 < count else -1 for k in range(count)]
        dead = [False] * count
        # Max-heap of candidate merges: best score first, leftmost on ties. Entries go
        # stale when either side changed; (lsize, rsize) detect that, as in C++.
        heap: list[tuple[float, int, int, int, int, int]] = []

        def consider(l: int, r: int) -> None:
            if l < 0 or r < 0:
                return
            tid = self.ids.get(strs[l] + strs[r])
            if tid is not None:
                heapq.heappush(heap, (-self.scores[tid], l, r, tid, len(strs[l]), len(strs[r])))

        for k in range(count - 1):
            consider(k, k + 1)
        while heap:
            _, l, r, tid, ls, rs = heapq.heappop(heap)
            if dead[l] or dead[r] or nxt[l] != r or len(strs[l]) != ls or len(strs[r]) != rs:
                continue
            strs[l] += strs[r]
            ids[l] = tid
            dead[r] = True
            nxt[l] = nxt[r]
            if nxt[l] >= 0:
                prev[nxt[l]] = l
            consider(prev[l], l)
            consider(l, nxt[l])
        out.extend(ids[k] for k in range(count) if not dead[k])

    def encode(self, text: Union[str, bytes], bos: bool = True, eos: bool = False) -> list[int]:
        """Token ids of `text` with the dummy prefix, as Tokenizer::encode(text, bos, eos).
        "\\n" has no piece, so lines encode separately; only the first gets the prefix."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out: list[int] = [BOS] if bos else []
        lines = data.split(b"\n")
        for k, line in enumerate(lines):
            if k == 0:
                if data:
                    self._encode_segment(b" " + line, out)
            else:
                out.append(ord("\n") + 3)
                self._encode_segment(line, out)
        if eos:
            out.append(EOS)
        return out

    def decode_bytes(self, prev: int, tok: int) -> bytes:
        """The bytes of `tok` after `prev`: drops the space after BOS; <0xNN> is a byte."""
        if tok < 0 or tok >= len(self.pieces):
            raise ValueError(f"token id {tok} outside the vocabulary [0, {len(self.pieces)})")
        piece = self.pieces[tok]
        if prev == BOS and piece[:1] == b" ":
            piece = piece[1:]
        m = _BYTE_PIECE.match(piece) if len(piece) == 6 else None
        return bytes([int(m.group(1), 16)]) if m else piece

    def decode(self, prev: int, tok: int) -> str:
        """As Tokenizer::decode; a lone byte token is kept losslessly as a surrogate
        escape (`.encode("utf-8", "surrogateescape")` gives the C++ bytes back)."""
        return self.decode_bytes(prev, tok).decode("utf-8", "surrogateescape")

    def decode_all(self, tokens: Seq[int]) -> str:
        """Decodes a sequence (its first token follows BOS). Byte tokens are joined
        first, so characters spelled as several byte tokens come out whole."""
        out = bytearray()
        prev = BOS
        for t in tokens:
            out += self.decode_bytes(prev, t)
            prev = t
        return out.decode("utf-8", "replace")


# ----------------------------------------------------------------------------------
# Model (llama2.c legacy fp32 checkpoint), the computation of model.cpp.
# ----------------------------------------------------------------------------------
@dataclass
class Config:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool = True

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_size


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """w * (x / sqrt(mean(x^2) + 1e-5)), row by row."""
    ss = (x * x).mean(dim=-1, keepdim=True) + 1e-5
    return w * (x * (1.0 / torch.sqrt(ss)))


class Model:
    """Weights as float32 tensors; matrices are [out, in] as in the file (y = x @ W.T)."""

    def __init__(self, cfg: Config, w: dict[str, torch.Tensor]) -> None:
        self.config = cfg
        self.w = w
        hs = cfg.head_size
        # RoPE tables as model.cpp builds them: powf / cosf / sinf in fp32 (cos and sin
        # are evaluated in double and rounded, i.e. correctly rounded fp32).
        i2 = np.arange(0, hs, 2, dtype=np.float32)
        freq = np.float32(1.0) / np.power(np.float32(10000.0), i2 / np.float32(hs))
        val = np.arange(cfg.seq_len, dtype=np.float32)[:, None] * freq[None, :]  # fp32 product
        self.rope_cos = torch.from_numpy(np.cos(val.astype(np.float64)).astype(np.float32))
        self.rope_sin = torch.from_numpy(np.sin(val.astype(np.float64)).astype(np.float32))

    @staticmethod
    def load(path: str) -> "Model":
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.size < 28:
            raise ValueError(f"checkpoint '{path}' is {raw.size} bytes: no header")
        h = [int(v) for v in raw[:28].view("<i4")]
        cfg = Config(h[0], h[1], h[2], h[3], h[4], abs(h[5]), h[6], shared_classifier=h[5] > 0)
        bad = lambda v, hi: v <= 0 or v > hi  # noqa: E731
        if (bad(cfg.dim, 1 << 16) or bad(cfg.hidden_dim, 1 << 18) or bad(cfg.n_layers, 1024)
                or bad(cfg.n_heads, 1024) or bad(cfg.n_kv_heads, 1024) or bad(cfg.vocab_size, 1 << 20)
                or bad(cfg.seq_len, 1 << 20) or cfg.dim % cfg.n_heads or cfg.n_heads % cfg.n_kv_heads
                or cfg.head_size % 2):
            raise ValueError(f"checkpoint '{path}' has an impossible header {h}")
        L, D, H, KV, V = cfg.n_layers, cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.vocab_size
        shapes = [("emb", (V, D)), ("rms_att", (L, D)), ("wq", (L, D, D)), ("wk", (L, KV, D)),
                  ("wv", (L, KV, D)), ("wo", (L, D, D)), ("rms_ffn", (L, D)), ("w1", (L, H, D)),
                  ("w2", (L, D, H)), ("w3", (L, H, D)), ("rms_final", (D,)),
                  ("freq_cis", (cfg.seq_len, cfg.head_size))]  # legacy real + imag: unused
        if not cfg.shared_classifier:
            # llama2.c puts wcls after the legacy tables. (The C++ runtime checks this
            # size too, then refuses such checkpoints; here wcls is simply used.)
            shapes.append(("wcls", (V, D)))
        floats = sum(int(np.prod(s)) for _, s in shapes)
        if raw.size != 28 + 4 * floats:
            raise ValueError(f"checkpoint '{path}' is {raw.size} bytes; its header implies {28 + 4 * floats}")
        data = raw[28:].view("<f4")
        w: dict[str, torch.Tensor] = {}
        off = 0
        for name, shape in shapes:
            n = int(np.prod(shape))
            w[name] = torch.from_numpy(data[off:off + n].astype(np.float32).reshape(shape))
            off += n
        del w["freq_cis"]
        w["cls"] = w.pop("wcls") if "wcls" in w else w["emb"]
        return Model(cfg, w)

    def _attention_layer(self, x: torch.Tensor, layer: int, cache: "PagedKVCache",
                         slots: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """One transformer layer for positions [start, end); x is [n, dim]."""
        c, w = self.config, self.w
        n, hs, kvh = end - start, c.head_size, c.n_kv_heads
        group = c.n_heads // kvh
        xn = _rmsnorm(x, w["rms_att"][layer])
        q = (xn @ w["wq"][layer].T).view(n, c.n_heads, hs // 2, 2)
        k = (xn @ w["wk"][layer].T).view(n, kvh, hs // 2, 2)
        v = xn @ w["wv"][layer].T
        # RoPE on interleaved pairs (2i, 2i+1) of each head.
        cs = self.rope_cos[start:end, None, :]
        sn = self.rope_sin[start:end, None, :]

        def rotate(t: torch.Tensor) -> torch.Tensor:
            t0, t1 = t[..., 0], t[..., 1]
            return torch.stack((t0 * cs - t1 * sn, t0 * sn + t1 * cs), dim=-1).flatten(-2)

        q, k = rotate(q), rotate(k)  # [n, heads, hs]
        # Write this chunk's K (after RoPE) and V into its slots, then read all [0, end).
        flat = cache.layers[layer].view(2, -1, c.kv_dim)
        flat[0, slots[start:end]] = k.reshape(n, c.kv_dim).to(flat.dtype)
        flat[1, slots[start:end]] = v.to(flat.dtype)
        kk = flat[0, slots[:end]].float().view(end, kvh, hs).permute(1, 2, 0)  # [kvh, hs, end]
        vv = flat[1, slots[:end]].float().view(end, kvh, hs).transpose(0, 1)   # [kvh, end, hs]
        # Query head h = g * group + j reads KV head g.
        qg = q.view(n, kvh, group, hs).permute(1, 2, 0, 3).reshape(kvh, group * n, hs)
        scores = torch.bmm(qg, kk).view(kvh, group, n, end) * (1.0 / math.sqrt(hs))
        qpos = torch.arange(start, end).view(n, 1)
        future = torch.arange(end).view(1, end) > qpos  # causal mask
        scores = scores.masked_fill(future, float("-inf"))
        att = torch.softmax(scores, dim=-1).view(kvh, group * n, end)
        out = torch.bmm(att, vv).view(kvh, group, n, hs).permute(2, 0, 1, 3).reshape(n, c.dim)
        x = x + out @ w["wo"][layer].T
        # SwiGLU feed-forward.
        xn = _rmsnorm(x, w["rms_ffn"][layer])
        h1 = xn @ w["w1"][layer].T
        h3 = xn @ w["w3"][layer].T
        return x + ((h1 * torch.sigmoid(h1)) * h3) @ w["w2"][layer].T

    @torch.no_grad()
    def prefill(self, cache: "PagedKVCache", seq: "Sequence", start: Optional[int] = None,
                end: Optional[int] = None) -> torch.Tensor:
        """Computes positions [start, end) of seq.tokens (default [num_computed, len)),
        writes their K/V into the sequence's blocks (allocating as needed) and returns
        the logits [vocab] of position end - 1. Attention reads positions [0, end) from
        the blocks, so positions [0, start) must already be there (computed here, or
        scattered in from elsewhere and counted in seq.num_computed)."""
        c = self.config
        start = seq.num_computed if start is None else start
        end = len(seq.tokens) if end is None else end
        if not 0 <= start < end <= len(seq.tokens):
            raise ValueError(f"prefill range [{start}, {end}) of a {len(seq.tokens)}-token sequence")
        if start > seq.num_computed:
            raise ValueError(f"prefill from {start}, but only {seq.num_computed} positions are cached")
        if end > c.seq_len:
            raise ValueError(f"{end} positions exceed the model's context of {c.seq_len}")
        toks = seq.tokens[start:end]
        if any(t < 0 or t >= c.vocab_size for t in toks):
            raise ValueError(f"token id outside the vocabulary [0, {c.vocab_size})")
        cache.allocate(end, seq.block_table)
        slots = cache.slots(seq.block_table, end)
        x = self.w["emb"][torch.tensor(toks, dtype=torch.long)]
        for layer in range(c.n_layers):
            x = self._attention_layer(x, layer, cache, slots, start, end)
        seq.num_computed = max(seq.num_computed, end)
        return _rmsnorm(x[-1], self.w["rms_final"]) @ self.w["cls"].T

    def decode_step(self, cache: "PagedKVCache", seq: "Sequence", token: int) -> torch.Tensor:
        """Appends `token` to a fully computed sequence, computes it, returns its logits."""
        if seq.num_computed != len(seq.tokens):
            raise ValueError(f"decode_step needs all {len(seq.tokens)} tokens cached, {seq.num_computed} are")
        seq.tokens.append(int(token))
        n = len(seq.tokens)
        return self.prefill(cache, seq, n - 1, n)


# ----------------------------------------------------------------------------------
# Paged KV cache (vLLM-style) and its packed (kvstream) view.
# ----------------------------------------------------------------------------------
class PagedKVCache:
    """Per layer one tensor [2, num_blocks, block_size, kv_heads, head_size] (plane 0:
    K after RoPE, plane 1: V) and a free-block list shared by all sequences."""

    def __init__(self, model_config: Config, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.config = model_config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        shape = (2, num_blocks, block_size, model_config.n_kv_heads, model_config.head_size)
        self.layers: list[torch.Tensor] = [torch.zeros(shape, dtype=dtype) for _ in range(model_config.n_layers)]
        self.free_blocks: list[int] = list(range(num_blocks))  # handed out from the front

    def allocate(self, n_tokens: int, block_table: Optional[list[int]] = None) -> list[int]:
        """Grows `block_table` (in place; a new one if None) to hold n_tokens; returns it."""
        table = [] if block_table is None else block_table
        need = -(-n_tokens // self.block_size) - len(table)
        if need > len(self.free_blocks):
            raise RuntimeError(f"out of KV blocks: need {need}, {len(self.free_blocks)} free")
        if need > 0:
            table.extend(self.free_blocks[:need])
            del self.free_blocks[:need]
        return table

    def free(self, block_table: list[int]) -> None:
        """Returns the table's blocks to the free list and empties the table."""
        free = set(self.free_blocks)
        for b in block_table:
            if b in free or not 0 <= b < self.num_blocks:
                raise ValueError(f"block {b} is not allocated")
            free.add(b)
        self.free_blocks.extend(block_table)
        block_table.clear()

    def slots(self, block_table: Seq[int], n_tokens: int, first_token: int = 0) -> torch.Tensor:
        """Flat slot index (block * block_size + offset) of positions [first, first + n)."""
        pos = torch.arange(first_token, first_token + n_tokens)
        if first_token + n_tokens > len(block_table) * self.block_size:
            raise ValueError(f"block table of {len(block_table)} blocks cannot hold {first_token + n_tokens} tokens")
        table = torch.tensor(list(block_table), dtype=torch.long)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size


@dataclass
class Sequence:
    """One request: its token ids, its block table and how many leading positions
    already have their KV in the cache."""
    tokens: list[int]
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0


def gather_packed(cache: PagedKVCache, block_table: Seq[int], n_tokens: int) -> torch.Tensor:
    """Positions [0, n_tokens) as kvstream's packed layout [layers, 2, n_tokens, kv_dim]."""
    slots = cache.slots(block_table, n_tokens)
    kvd = cache.config.kv_dim
    return torch.stack([layer.view(2, -1, kvd)[:, slots] for layer in cache.layers])


def scatter_packed(cache: PagedKVCache, block_table: Seq[int], packed: torch.Tensor, first_token: int = 0) -> None:
    """Writes packed [layers, 2, n, kv_dim] KV into positions [first_token, first + n)
    of the table's blocks (which must exist; see PagedKVCache.allocate)."""
    c = cache.config
    if packed.dim() != 4 or packed.shape[0] != c.n_layers or packed.shape[1] != 2 or packed.shape[3] != c.kv_dim:
        raise ValueError(f"packed KV of shape {tuple(packed.shape)}, expected [{c.n_layers}, 2, n, {c.kv_dim}]")
    slots = cache.slots(block_table, packed.shape[2], first_token)
    for layer, src in zip(cache.layers, packed):
        layer.view(2, -1, c.kv_dim)[:, slots] = src.to(layer.dtype)


def packed_from_bytes(data: bytes, config: Config, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Raw packed KV bytes (e.g. `kvstream-tinyllama dump-kv` output) as a tensor."""
    t = torch.frombuffer(bytearray(data), dtype=dtype)
    return t.view(config.n_layers, 2, -1, config.kv_dim)


def generate_greedy(model: Model, cache: PagedKVCache, seq: Sequence, n: int) -> list[int]:
    """Greedy continuation of seq.tokens for up to n new tokens, as the C++
    generate_with_kv: uncached prompt positions are computed (the last one recomputed
    when the whole prompt is cached), and it stops at BOS. New tokens are appended to
    seq.tokens; the last one is not computed yet."""
    if not seq.tokens:
        raise ValueError("generate needs at least one prompt token")
    if seq.num_computed >= len(seq.tokens):
        seq.num_computed = len(seq.tokens) - 1  # its logits start the generation
    logits = model.prefill(cache, seq)
    out: list[int] = []
    for i in range(n):
        nxt = int(torch.argmax(logits))  # first maximum, like std::max_element
        if nxt == BOS:
            break
        out.append(nxt)
        if i + 1 == n or len(seq.tokens) >= model.config.seq_len:
            seq.tokens.append(nxt)
            break
        logits = model.decode_step(cache, seq, nxt)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="stories260K greedy generation with a paged KV cache (PyTorch)")
    ap.add_argument("--prompt", default="", help="prompt text (BOS is prepended)")
    ap.add_argument("--steps", type=int, default=64, help="new tokens to generate")
    ap.add_argument("--data", default=None, help="data directory (default: $KVSTREAM_TINYLLAMA or ../shared/data/tinyllama)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--ids", action="store_true", help="also print the token ids on stderr")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    d = data_dir(args.data)
    model = Model.load(os.path.join(d, "stories260K.bin"))
    tok = Tokenizer.load(os.path.join(d, "tok512.bin"))
    seq = Sequence(tok.encode(args.prompt, bos=True))
    if len(seq.tokens) > model.config.seq_len:
        raise SystemExit(f"prompt of {len(seq.tokens)} tokens exceeds the context of {model.config.seq_len}")
    cache = PagedKVCache(model.config, -(-model.config.seq_len // args.block_size), args.block_size)
    gen = generate_greedy(model, cache, seq, args.steps)
    text = bytearray()
    prev = seq.tokens[len(seq.tokens) - len(gen) - 1]
    for t in gen:
        text += tok.decode_bytes(prev, t)
        prev = t
    sys.stdout.write(text.decode("utf-8", "replace") + "\n")
    if args.ids:
        print(" ".join(map(str, gen)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
