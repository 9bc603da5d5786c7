#!/usr/bin/env python3
"""Serves requests that share a long prefix with kvstream as the KV connector.

A storage node runs in this process on loopback (kvstream.Server, temporary
directory), or --address names one. The PyTorch stories260K runtime
(tinyllama_torch.py) serves N requests: each is the same ~400-token document (held-out
text from the second half of eval.txt) followed by a different short sentence, with a
vLLM-style paged KV cache (block 16, shuffled blocks) and KvStreamConnector
(kv_connector.py) in vLLM's connector flow. The first request finds nothing stored:
it prefills everything and its whole chunks are stored. Each later one looks the
prompt up, fetches the stored prefix straight into its own blocks, prefills only the
rest, and generates greedily.

For each request it prints the tokens matched, the fetch time, the suffix prefill
time and the time to first token (TTFT), next to the same request's TTFT with a full
prefill from text (no kvstream) measured in the same run, and whether the greedy
continuation equals the one from exact KV (the full prefill).

The link: tinyllama's KV is tiny, so as in the C++ demo (examples/demo) the fetches
go through a paced link whose default rate is scaled so that the stored prefix's KV
in fp16 needs 3x as long as recomputing the request from text; --link-mbps sets it.
Fetches are adaptive by default: each chunk at the coarsest-needed level that meets
the deadline (by default half of the text recompute's TTFT, as in the demo), never
past the 1% perplexity bound (policy.max_quality_loss_pct); --level N fetches every
chunk at level N (0 = near-lossless).

Run: /usr/bin/python3 examples/python/serve_shared_prefix.py [--level 0] [--json]
(needs the kvstream package: build the kvstream_python target; the profile is
build/tinyllama.kvsprofile, which `make demo` writes, or --profile.)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("KVSTREAM_BUILD_DIR") or os.path.join(REPO, "build")
sys.path.insert(0, HERE)
try:
    import kvstream
except ImportError:  # from the checkout: the build tree's package
    sys.path.insert(0, os.path.join(BUILD, "python"))
    import kvstream

import tinyllama_torch as tl  # noqa: E402
from kv_connector import (  # noqa: E402
    ForwardContext, KVCacheBlocks, KvStreamConnector, NewRequestData, Request, SchedulerOutput)

NEWLINE = ord("\n") + 3  # the tokenizer's "\n" piece
SUFFIXES = [
    "Then Lily asked her mom a question.",
    "The next day, Tom went to the park with his dog.",
    "Suddenly, a big storm came.",
    "Ben wanted to share his toy with his sister.",
    "One day, the little bird could not fly.",
    "Mia found a shiny key under the old tree.",
    "The cat and the dog became best friends.",
    "At night, the stars were very bright.",
]


@dataclass
class RequestResult:
    request: int
    prompt_tokens: int
    matched_tokens: int = 0      #: tokens the connector promised (lookup, whole chunks, < prompt)
    loaded_tokens: int = 0       #: tokens whose KV landed in the blocks
    fetch_ms: float = 0.0
    suffix_tokens: int = 0       #: tokens prefilled
    suffix_prefill_ms: float = 0.0
    save_ms: float = 0.0         #: storing new chunks (ends the forward pass, as wait_for_save in vLLM)
    ttft_ms: float = 0.0         #: lookup + fetch + prefill + save + first token
    full_prefill_ttft_ms: float = 0.0  #: the same request prefilled from text, no kvstream
    same_output: bool = False    #: greedy continuation equals the one from exact KV
    levels: list[int] = field(default_factory=list)
    fetch_bytes: int = 0
    quality_loss_pct: float = 0.0  #: the fetched levels' worst perplexity increase (profile)
    stored_chunks: int = 0       #: chunks this request stored
    fallback: str = ""           #: why a promised fetch did not land (then its tokens were prefilled)
    save_error: str = ""         #: why its chunks were not stored (the request is served all the same)
    evicted_chunks: int = 0      #: chunks removed to store this request's (eviction.when_full)
    output: str = ""


def eval_text(data: str) -> str:
    with open(os.path.join(data, "eval.txt"), "rb") as f:
        return f.read().decode("utf-8").replace("\n\n", "\n").rstrip("\n")


def shared_document(tok: tl.Tokenizer, text: str, n_tokens: int) -> list[int]:
    """BOS and n_tokens - 1 tokens of held-out text (second half, from a line start)."""
    start = text.index("\n", len(text) // 2) + 1
    ids = tok.encode(text[start:start + 8 * n_tokens], bos=True)
    if len(ids) < n_tokens:
        raise SystemExit(f"the eval text is too short for a {n_tokens}-token document")
    return ids[:n_tokens]


def greedy_rest(model: tl.Model, cache: tl.PagedKVCache, seq: tl.Sequence, first: int, steps: int) -> list[int]:
    """The greedy continuation from its first token (as tl.generate_greedy: stops at BOS)."""
    out: list[int] = []
    nxt = first
    for i in range(steps):
        if nxt == tl.BOS:
            break
        out.append(nxt)
        if i + 1 == steps or len(seq.tokens) >= model.config.seq_len:
            break
        nxt = int(torch.argmax(model.decode_step(cache, seq, nxt)))
    return out


def full_prefill(model: tl.Model, cache: tl.PagedKVCache, prompt: list[int], steps: int) -> tuple[list[int], float]:
    """Exact KV: the whole prompt prefilled from text. Returns the output and the TTFT."""
    seq = tl.Sequence(list(prompt))
    t0 = time.perf_counter()
    first = int(torch.argmax(model.prefill(cache, seq)))
    ttft = time.perf_counter() - t0
    out = greedy_rest(model, cache, seq, first, steps)
    cache.free(seq.block_table)
    return out, ttft


def default_profile() -> str:
    return os.path.join(BUILD, "tinyllama.kvsprofile")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="serve shared-prefix requests with kvstream as the KV connector "
                                             "(stories260K, PyTorch, paged KV cache)")
    ap.add_argument("--requests", type=int, default=4, help="requests (each the document + its own sentence)")
    ap.add_argument("--prefix-tokens", type=int, default=400, help="tokens of the shared document (BOS included)")
    ap.add_argument("--steps", type=int, default=32, help="greedy tokens generated per request")
    ap.add_argument("--level", type=int, default=None, help="fetch every chunk at this level (0: near-lossless); "
                                                             "default: adaptive within the 1%% quality bound")
    ap.add_argument("--link-mbps", type=float, default=0.0,
                    help="paced link rate in Mbit/s (default: scaled as the C++ demo: the prefix's fp16 KV takes "
                         "3x the text recompute)")
    ap.add_argument("--deadline-ms", type=float, default=0.0,
                    help="adaptive: TTFT budget in ms (default: half the text recompute TTFT, as the demo)")
    ap.add_argument("--max-quality-loss", type=float, default=1.0, help="adaptive: worst perplexity increase (%%)")
    ap.add_argument("--chunk-tokens", type=int, default=64, help="tokens per stored chunk")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    ap.add_argument("--profile", default=None, help="codec profile (default: $KVSTREAM_BUILD_DIR or build/"
                                                    "tinyllama.kvsprofile)")
    ap.add_argument("--data", default=None, help="tinyllama data directory (default: $KVSTREAM_TINYLLAMA or "
                                                 "../shared/data/tinyllama)")
    ap.add_argument("--address", default=None, help="host:port of a running kvstream-server (default: start one "
                                                    "in this process)")
    ap.add_argument("--namespace", default="serve", help="namespace on the node")
    ap.add_argument("--node-quota-bytes", type=int, default=0,
                    help="bound on what the namespace stores on the node this example starts (0: none); a full "
                         "store fails saves (NoSpace) and the requests are served all the same, or, with "
                         "KVSTREAM_EVICTION_WHEN_FULL=true, removes the oldest chunks to make room")
    ap.add_argument("--secret", default=None, help="its secret (with --address; else $KVSTREAM_STORAGE_SECRET)")
    ap.add_argument("--keep-stored", action="store_true",
                    help="with --address: do not remove the document's chunks first (the run starts warm)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=1, help="block shuffle seed")
    ap.add_argument("--log-level", default="error", help="kvstream log level")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.steps < 1 or args.prefix_tokens < 2 * args.chunk_tokens:
        ap.error("--requests and --steps must be >= 1, --prefix-tokens >= 2 chunks")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    kvstream.set_log_level(args.log_level)
    data = tl.data_dir(args.data)
    model = tl.Model.load(os.path.join(data, "stories260K.bin"))
    tok = tl.Tokenizer.load(os.path.join(data, "tok512.bin"))
    profile = args.profile or default_profile()
    if not os.path.exists(profile):
        print(f"serve_shared_prefix: no codec profile at {profile} (run `make demo`, or build/bin/kvstream-profile "
              f"--out {profile}, or pass --profile)", file=sys.stderr)
        return 2
    cfg_model = model.config
    doc = shared_document(tok, eval_text(data), args.prefix_tokens)
    prompts = [doc + [NEWLINE] + tok.encode(SUFFIXES[i % len(SUFFIXES)], bos=False) for i in range(args.requests)]
    if max(map(len, prompts)) + args.steps > cfg_model.seq_len:
        print(f"serve_shared_prefix: prompts of up to {max(map(len, prompts))} tokens + {args.steps} steps exceed "
              f"the context of {cfg_model.seq_len}", file=sys.stderr)
        return 2

    blocks_per_seq = -(-cfg_model.seq_len // args.block_size)
    cache = tl.PagedKVCache(cfg_model, 2 * blocks_per_seq, args.block_size)
    random.Random(args.seed).shuffle(cache.free_blocks)  # blocks scattered, as a busy vLLM's are

    # ---- exact KV: every request prefilled from text, in this run -------------------------
    full_prefill(model, cache, prompts[0], 1)  # warm-up
    stored_prefix = len(doc) // args.chunk_tokens * args.chunk_tokens
    warm = tl.Sequence(list(prompts[0]))  # one suffix prefill on an exact prefix: the adaptive budget's share
    model.prefill(cache, warm, 0, stored_prefix)
    t0 = time.perf_counter()
    int(torch.argmax(model.prefill(cache, warm)))
    suffix_estimate = time.perf_counter() - t0
    cache.free(warm.block_table)
    references = [full_prefill(model, cache, p, args.steps) for p in prompts]
    text_ttft = statistics.median(t for _, t in references)

    # ---- the link, as the C++ demo scales it ------------------------------------------------
    fp16_bytes = stored_prefix * cfg_model.n_layers * 2 * cfg_model.kv_dim * 2
    link_bps = args.link_mbps * 1e6 if args.link_mbps > 0 else fp16_bytes * 8 / (3.0 * text_ttft)
    budget_s = args.deadline_ms / 1e3 if args.deadline_ms > 0 else 0.5 * text_ttft
    adaptive = args.level is None
    # A fixed level has no deadline to plan for: its fetch gets a generous one. The
    # adaptive one plans against the budget less the suffix prefill that follows it.
    fetch_deadline_s = max(budget_s - suffix_estimate, 1e-3) if adaptive else 30.0

    results: list[RequestResult] = []
    with contextlib.ExitStack() as stack:
        secret = args.secret or os.environ.get("KVSTREAM_STORAGE_SECRET") or ""
        if args.address:
            address = args.address
        else:
            secret = secrets.token_hex(16)
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvstream-serve-"))
            node = stack.enter_context(kvstream.Server.start(tmp, {args.namespace: secret},
                                                             namespace_quota_bytes=args.node_quota_bytes))
            address = node.address
        base = kvstream.StoreConfig({
            "storage.address": address, "storage.namespace": args.namespace, "storage.secret": secret,
            "storage.paced_bits_per_second": link_bps, "codec.profile": profile, "codec.model_id": "stories260K",
            "codec.chunk_tokens": args.chunk_tokens, "policy.prior_bits_per_second": link_bps,
            "policy.max_quality_loss_pct": args.max_quality_loss})
        store = stack.enter_context(kvstream.KvStore.open(kvstream.StoreConfig.from_env(base)))
        if args.level is not None and not 0 <= args.level < len(store.levels):
            print(f"serve_shared_prefix: --level {args.level}: the profile has levels 0..{len(store.levels) - 1}",
                  file=sys.stderr)
            return 2
        if args.address and not args.keep_stored:
            store.remove(doc)
        quality = {li.level: li.ppl_increase_pct for li in store.levels}

        conn = KvStreamConnector(store, args.block_size, level=args.level, fetch_deadline_s=fetch_deadline_s)
        kv_caches = {f"model.layers.{i}.self_attn": layer for i, layer in enumerate(cache.layers)}
        conn.register_kv_caches(kv_caches)

        for i, prompt in enumerate(prompts):
            r = RequestResult(i, len(prompt))
            req = Request(f"req-{i}", list(prompt))
            t0 = time.perf_counter()
            # Scheduler: how much is stored, blocks, what to load and save this step.
            r.matched_tokens, _ = conn.get_num_new_matched_tokens(req, 0)
            blocks = cache.allocate(len(prompt))
            conn.update_state_after_alloc(req, KVCacheBlocks(blocks), r.matched_tokens)
            meta = conn.build_connector_meta(SchedulerOutput([NewRequestData(req.request_id, req.prompt_token_ids,
                                                                             (blocks,), 0)]))
            # Worker: load into the blocks, then the forward pass over the rest.
            conn.bind_connector_metadata(meta)
            conn.start_load_kv(ForwardContext(kv_caches))
            for name in kv_caches:
                conn.wait_for_layer_load(name)  # the first one waits for the whole fetch
            t_loaded = time.perf_counter()
            load = conn.load_results.pop(req.request_id, None)
            if load is not None:
                r.loaded_tokens = load.loaded_tokens
                r.fetch_ms = load.seconds * 1e3
                if load.error is not None:
                    r.fallback = load.error.code_name
                if load.report is not None:
                    r.levels = load.report.levels
                    r.fetch_bytes = load.report.bytes
                    r.quality_loss_pct = max([quality[lv] for lv in r.levels], default=0.0)
            seq = tl.Sequence(list(prompt), blocks, num_computed=r.loaded_tokens)
            r.suffix_tokens = len(prompt) - r.loaded_tokens
            logits = model.prefill(cache, seq)
            t_prefilled = time.perf_counter()
            for name, layer in kv_caches.items():
                conn.save_kv_layer(name, layer, None)
            conn.wait_for_save()
            conn.clear_connector_metadata()
            first = int(torch.argmax(logits))
            t_first = time.perf_counter()
            r.suffix_prefill_ms = (t_prefilled - t_loaded) * 1e3
            r.save_ms = (t_first - t_prefilled) * 1e3
            r.ttft_ms = (t_first - t0) * 1e3
            put = conn.put_reports.pop(req.request_id, None)
            r.stored_chunks = put.chunks - put.already_stored if put else 0
            r.evicted_chunks = put.evicted_chunks if put else 0
            save_error = conn.save_errors.pop(req.request_id, None)
            r.save_error = save_error.code_name if save_error is not None else ""
            out = greedy_rest(model, cache, seq, first, args.steps)
            ref_out, ref_ttft = references[i]
            r.full_prefill_ttft_ms = ref_ttft * 1e3
            r.same_output = out == ref_out
            r.output = tok.decode_all(out)
            conn.request_finished(req, blocks)
            cache.free(blocks)
            results.append(r)

    summary = {
        "mode": "adaptive" if adaptive else f"level {args.level}",
        "link_mbps": link_bps / 1e6,
        "link_default": args.link_mbps <= 0,
        "ttft_budget_ms": budget_s * 1e3 if adaptive else None,
        "fetch_deadline_ms": fetch_deadline_s * 1e3,
        "max_quality_loss_pct": args.max_quality_loss if adaptive else None,
        "text_ttft_ms": text_ttft * 1e3,
        "shared_prefix_tokens": len(doc),
        "stored_prefix_tokens": stored_prefix,
        "chunk_tokens": args.chunk_tokens,
        "steps": args.steps,
        "requests": [asdict(r) for r in results],
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_table(summary)
    return 0


def print_table(s: dict) -> None:
    mode = s["mode"]
    if mode == "adaptive":
        mode += f" (TTFT budget {s['ttft_budget_ms']:.1f} ms, fetch deadline {s['fetch_deadline_ms']:.1f} ms, " \
                f"<= {s['max_quality_loss_pct']:g}% ppl)"
    print(f"kvstream shared-prefix serving: {len(s['requests'])} requests, {s['shared_prefix_tokens']}-token shared "
          f"document ({s['stored_prefix_tokens']} in whole {s['chunk_tokens']}-token chunks), {s['steps']} greedy "
          f"tokens each")
    print(f"link {s['link_mbps']:.2f} Mbit/s{' (default: fp16 prefix KV = 3x text recompute)' if s['link_default'] else ''}; "
          f"fetch: {mode}")
    head = ("req", "prompt", "matched", "fetch ms", "prefilled", "prefill ms", "save ms", "TTFT ms", "full TTFT ms",
            "speedup", "levels", "same output")
    rows = []
    for r in s["requests"]:
        levels = ",".join(map(str, r["levels"])) if r["levels"] else "-"
        if r["fallback"]:
            levels = f"failed: {r['fallback']}"
        rows.append((str(r["request"]), str(r["prompt_tokens"]), str(r["matched_tokens"]), f"{r['fetch_ms']:.1f}",
                     str(r["suffix_tokens"]), f"{r['suffix_prefill_ms']:.1f}", f"{r['save_ms']:.1f}",
                     f"{r['ttft_ms']:.1f}", f"{r['full_prefill_ttft_ms']:.1f}",
                     f"{r['full_prefill_ttft_ms'] / r['ttft_ms']:.2f}x", levels, "yes" if r["same_output"] else "NO"))
    widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    print("(TTFT: lookup + fetch + prefill of the unfetched tokens + storing new chunks + first token; full TTFT: "
          "the same prompt prefilled from text in this run. Request 0 finds nothing stored and stores the chunks.)")


if __name__ == "__main__":
    sys.exit(main())
