"""Tests of the kvstream Python package (python/): StoreConfig, errors with their
status codes, and a KvStore against an in-process storage node with the real
tinyllama codec profile, storing and fetching KV that the PyTorch runtime
(examples/python/tinyllama_torch.py) computed for a prompt from eval.txt: put,
lookup, a shared prefix stored once, fetch at level 0 into numpy arrays and torch
tensors (in place), into a shuffled paged cache, adaptive, cancelled, and with the
GIL released while it waits.

Run: /usr/bin/python3 -m pytest -q tests/python/test_kvstream.py (after building the
kvstream_python target; conftest.py finds build/python).
"""
from __future__ import annotations

import gc
import os
import random
import secrets
import socket
import threading
import weakref

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch", reason="PyTorch is not installed for this python (use Debian's /usr/bin/python3)")
kvstream = pytest.importorskip("kvstream", reason="the kvstream package is not built (ninja -C build kvstream_python)")

from conftest import data_dir  # noqa: E402
import tinyllama_torch as tl  # noqa: E402

torch.set_num_threads(1)
CHUNK = 64
PROMPT_TOKENS = 300  # 4 whole chunks (256 tokens) and a 44-token tail
SECRET = secrets.token_hex(16)


# --- fixtures -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> tl.Model:
    path = os.path.join(data_dir(), "stories260K.bin")
    if not os.path.exists(path):
        pytest.skip(f"tinyllama data not found at {data_dir()} (set KVSTREAM_TINYLLAMA)")
    return tl.Model.load(path)


@pytest.fixture(scope="module")
def prompt(model) -> list[int]:
    tok = tl.Tokenizer.load(os.path.join(data_dir(), "tok512.bin"))
    with open(os.path.join(data_dir(), "eval.txt"), "rb") as f:
        text = f.read().decode("utf-8").replace("\n\n", "\n").rstrip("\n")
    ids = tok.encode(text[:1000], bos=True)[:PROMPT_TOKENS]
    assert len(ids) == PROMPT_TOKENS
    return ids


def exact_kv(model: tl.Model, ids: list[int]) -> np.ndarray:
    """The runtime's packed KV [layers, 2, tokens, kv_dim] (float32, K after RoPE)."""
    cache = tl.PagedKVCache(model.config, -(-len(ids) // 16) + 1, 16)
    seq = tl.Sequence(list(ids))
    model.prefill(cache, seq)
    return np.ascontiguousarray(tl.gather_packed(cache, seq.block_table, len(ids)).numpy())


@pytest.fixture(scope="module")
def kv(model, prompt) -> np.ndarray:
    return exact_kv(model, prompt)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with kvstream.Server.start(str(tmp_path_factory.mktemp("node")), {"ns": SECRET}) as server:
        yield server


def config(node, profile: str, model_id: str = "stories260K", **extra) -> kvstream.StoreConfig:
    c = kvstream.StoreConfig({"storage.address": node.address, "storage.namespace": "ns", "storage.secret": SECRET,
                              "codec.profile": profile, "codec.model_id": model_id, "codec.chunk_tokens": CHUNK})
    c.update(extra)
    return c


@pytest.fixture(scope="module")
def store(node, tinyllama_profile):
    with kvstream.KvStore.open(config(node, tinyllama_profile)) as s:
        yield s


@pytest.fixture(scope="module")
def stored(store, prompt, kv):
    """The prompt's KV, stored once (its first 4 chunks)."""
    report = store.put(prompt, kv)
    return report


@pytest.fixture(scope="module")
def level0(store, stored, prompt) -> np.ndarray:
    """The prompt's stored prefix fetched at level 0 into a numpy array."""
    dest = np.zeros((5, 2, PROMPT_TOKENS, 32), np.float32)
    report = store.fetch(prompt, dest, level=0).wait()
    assert report.tokens == 4 * CHUNK
    return dest


# --- StoreConfig -------------------------------------------------------------------


def test_config_set_get_describe():
    c = kvstream.StoreConfig()
    assert c.get("storage.address") == "127.0.0.1:7471" and c["codec.chunk_tokens"] == "256"
    c.set("storage.address", "10.0.0.1:9000")
    c.set("codec.chunk_tokens", 64)
    c.set("policy.max_quality_loss_pct", 0.5)
    c["storage.nodes"] = ["a:1", "b:2"]
    c["eviction.when_full"] = True  # a bool reads "true", not "1"
    assert c["eviction.when_full"] == "true"
    c.set("eviction.when_full", False)
    assert c["eviction.when_full"] == "false"
    c.set("storage.secret=hunter2-hunter2")
    assert c.get("storage.address") == "10.0.0.1:9000" and c.get("codec.chunk_tokens") == "64"
    assert float(c.get("policy.max_quality_loss_pct")) == 0.5 and c.get("storage.nodes") == "a:1,b:2"
    text = c.describe()
    assert "storage.address = 10.0.0.1:9000" in text and "KVSTREAM_STORAGE_ADDRESS" in text
    assert "hunter2" not in text and "hunter2" not in repr(c) and "(set)" in repr(c)
    d = kvstream.StoreConfig({"storage.address": "h:1"}, **{"codec.model_id": "m"})
    assert d.as_dict()["storage.address"] == "h:1" and d["codec.model_id"] == "m" and "codec.model_id" in d
    assert d.copy() == d and d != c
    rows = kvstream.settings()
    assert [r.name for r in rows] == list(c.as_dict())
    row = {r.name: r for r in rows}["storage.paced_bits_per_second"]
    assert row.env == "KVSTREAM_STORAGE_PACED_BITS_PER_SECOND" and row.default == "0" and row.doc
    name, default, env, doc = rows[0]  # plain tuples too
    assert name == "storage.kind" and default == "node"


def test_config_from_env(monkeypatch):
    monkeypatch.setenv("KVSTREAM_STORAGE_ADDRESS", "192.168.1.5:7000")
    monkeypatch.setenv("KVSTREAM_CODEC_CHUNK_TOKENS", "128")
    c = kvstream.StoreConfig.from_env()
    assert c["storage.address"] == "192.168.1.5:7000" and c["codec.chunk_tokens"] == "128"
    base = kvstream.StoreConfig({"codec.model_id": "mine", "codec.chunk_tokens": 32})
    c = kvstream.StoreConfig.from_env(base)
    assert c["codec.model_id"] == "mine" and c["codec.chunk_tokens"] == "128"
    assert base["codec.chunk_tokens"] == "32"  # base itself untouched
    monkeypatch.setenv("KVSTREAM_STORAGE_CONNECTIONS", "many")
    with pytest.raises(kvstream.InvalidArgument, match="KVSTREAM_STORAGE_CONNECTIONS") as e:
        kvstream.StoreConfig.from_env()
    assert e.value.code == int(kvstream.StatusCode.invalid_argument) == 1


# --- errors ----------------------------------------------------------------------------


def test_errors_carry_codes(tmp_path):
    c = kvstream.StoreConfig()
    with pytest.raises(kvstream.NotFound) as e:
        c.set("storage.adress", "x:1")
    assert e.value.code == 3 and e.value.code_name == "not_found" and "storage.adress" in e.value.message
    assert isinstance(e.value, kvstream.Error) and int(kvstream.StatusCode.not_found) == e.value.code
    with pytest.raises(ValueError) as e:  # InvalidArgument is a ValueError
        c.set("storage.connections", "-3")
    assert type(e.value) is kvstream.InvalidArgument and e.value.code == 1
    with pytest.raises(kvstream.InvalidType):
        c.set("codec.chunk_tokens", 1.5j)
    with pytest.raises(kvstream.InvalidArgument, match="codec.profile"):
        c.validate()
    c.update({"codec.profile": str(tmp_path / "missing.kvsprofile"), "codec.model_id": "m"})
    with pytest.raises(kvstream.Error) as e:
        kvstream.KvStore.open(c)
    assert e.value.code_name in ("io_error", "not_found") and "missing.kvsprofile" in str(e.value)
    # The hierarchy, for callers catching builtins.
    assert issubclass(kvstream.TimedOut, TimeoutError) and issubclass(kvstream.Unavailable, ConnectionError)
    assert issubclass(kvstream.PermissionDenied, PermissionError) and kvstream.Cancelled.code == 9
    assert kvstream.NoSpace.code == int(kvstream.StatusCode.no_space) == 14
    assert issubclass(kvstream.InvalidType, TypeError) and issubclass(kvstream.InvalidType, kvstream.InvalidArgument)


def test_array_errors(store, stored, model, prompt, kv):
    with pytest.raises(kvstream.InvalidArgument, match=r"expected \[5, 2, tokens, 32\]") as e:
        store.put(prompt, kv[:, :, :, :16].copy())
    assert e.value.code == 1
    with pytest.raises(kvstream.InvalidType, match="float64") as e:
        store.put(prompt, kv.astype(np.float64))
    assert isinstance(e.value, TypeError) and e.value.code == 1
    with pytest.raises(kvstream.InvalidType, match="int32"):
        store.fetch(prompt, torch.zeros(5, 2, PROMPT_TOKENS, 32, dtype=torch.int32))
    with pytest.raises(kvstream.InvalidArgument, match="C-contiguous"):
        store.put(prompt, np.asfortranarray(kv))
    ro = np.zeros_like(kv)
    ro.setflags(write=False)
    with pytest.raises(kvstream.InvalidArgument, match="read-only"):
        store.fetch(prompt, ro)
    with pytest.raises(kvstream.InvalidType, match="numpy array or a torch"):
        store.fetch(prompt, [[0.0]])
    with pytest.raises(kvstream.InvalidType, match="tokens"):
        store.lookup([1.0, 2.0])
    with pytest.raises(kvstream.InvalidArgument, match="less than one 64-token chunk"):
        store.fetch(prompt, np.zeros((5, 2, 10, 32), np.float32))
    cache = tl.PagedKVCache(model.config, 8, 16)
    with pytest.raises(kvstream.InvalidArgument, match="the layers have 8 blocks"):
        store.fetch_paged(prompt, cache.layers, list(range(7)) + [8] * 12, 16)
    with pytest.raises(kvstream.InvalidArgument, match="block_size 32"):
        store.fetch_paged(prompt, cache.layers, list(range(8)), 32)
    with pytest.raises(kvstream.InvalidArgument, match="5 layers"):
        store.fetch_paged(prompt, cache.layers[:4], list(range(8)), 16)
    with pytest.raises(kvstream.NotFound):
        store.fetch([7] * 200, np.zeros((5, 2, 200, 32), np.float32))
    with pytest.raises(kvstream.InvalidArgument, match="timeout"):
        store.lookup(prompt, timeout=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_server(tmp_path, tinyllama_profile):
    # Nothing listens: open fails.
    c = kvstream.StoreConfig({"storage.address": f"127.0.0.1:{free_port()}", "storage.namespace": "ns",
                              "storage.secret": SECRET, "codec.profile": tinyllama_profile, "codec.model_id": "m",
                              "storage.connect_timeout_ms": 2000})
    with pytest.raises((kvstream.Unavailable, kvstream.TimedOut)) as e:
        kvstream.KvStore.open(c)
    assert e.value.code in (7, 8)
    # A node that goes away under an open store: lookup fails with a code, no hang.
    server = kvstream.Server.start(str(tmp_path / "n"), {"ns": SECRET})
    store = kvstream.KvStore.open(config(server, tinyllama_profile))
    assert store.lookup([1] * 100, timeout=5) == 0
    server.stop()
    with pytest.raises((kvstream.Unavailable, kvstream.TimedOut)) as e:
        store.lookup([1] * 100, timeout=2)
    assert e.value.code_name in ("unavailable", "timed_out")
    store.close()
    assert store.closed
    with pytest.raises(kvstream.InvalidArgument, match="closed"):
        store.lookup([1])
    # Wrong secret.
    with kvstream.Server.start(str(tmp_path / "n2"), {"ns": SECRET}) as s2:
        bad = config(s2, tinyllama_profile)
        bad["storage.secret"] = "not-the-secret-at-all"
        with pytest.raises(kvstream.PermissionDenied) as e:
            kvstream.KvStore.open(bad)
        assert e.value.code == 10


# --- put, lookup, shared prefix --------------------------------------------------------


def test_put_and_lookup(store, stored, prompt):
    assert (stored.chunks, stored.already_stored, stored.tokens) == (4, 0, 256) and stored.bytes > 0
    assert store.geometry.layers == 5 and store.geometry.kv_heads == 4 and store.geometry.head_dim == 8
    assert store.geometry.planes == 2 and store.chunk_tokens == CHUNK and store.model_id == "stories260K"
    assert store.lookup(prompt) == 256
    assert store.lookup(prompt[:130]) == 128 and store.lookup(prompt[:63]) == 0
    assert store.lookup(np.array(prompt, dtype=np.int64)) == 256
    assert store.lookup(torch.tensor(prompt, dtype=torch.int32)[:200]) == 192
    assert store.lookup(prompt + [5] * 100) == 256
    edited = list(prompt)
    edited[2 * CHUNK + 3] ^= 1
    assert store.lookup(edited) == 2 * CHUNK  # every later key depends on every earlier token
    assert len(store.chunk_keys(prompt)) == 4


def test_shared_prefix_stored_once(store, stored, model, prompt):
    # Another prompt with the first 150 tokens in common: chunks 0 and 1 are shared.
    other = prompt[:150] + [(t * 7 + 3) % 500 + 3 for t in prompt[150:]]
    kv_other = torch.from_numpy(exact_kv(model, other))  # a torch tensor, taken in place
    report = store.put(other, kv_other)
    assert (report.chunks, report.already_stored, report.tokens) == (4, 2, 256)
    assert 0 < report.bytes < stored.bytes
    assert store.lookup(other) == 256 and store.lookup(prompt) == 256
    again = store.put(other, kv_other.view(5, 2, PROMPT_TOKENS, 4, 8))  # 5-D [.., kv_heads, head_dim] too
    assert again.already_stored == 4 and again.bytes == 0


# --- fetch -------------------------------------------------------------------------------


def test_fetch_level0_into_numpy(level0, kv):
    got, want = level0[:, :, :256], kv[:, :, :256]
    assert np.all(level0[:, :, 256:] == 0)  # the tail was not stored: untouched
    err = np.abs(got - want)
    # Near-lossless: errors are a small fraction of each (layer, plane)'s spread.
    spread = want.std(axis=(2, 3), keepdims=True)
    assert float((err / spread).max()) < 0.5 and float(err.mean() / want.std()) < 0.02
    assert np.count_nonzero(got) > 0.99 * got.size


def test_fetch_into_torch_tensor_in_place(store, level0, prompt):
    dest = torch.zeros(5, 2, PROMPT_TOKENS, 32)
    ptr = dest.data_ptr()
    fetch = store.fetch(prompt, dest, level=0)
    report = fetch.wait()
    assert report.tokens == 256 and report.levels == [0, 0, 0, 0] and report.bytes > 0
    assert report.max_quality_loss_pct < 0.1 and report.recompute == []
    assert dest.data_ptr() == ptr and float(dest[:, :, :256].abs().sum()) > 0  # the tensor's own memory
    assert np.array_equal(dest.numpy(), level0)
    # 5-D, float16 and bfloat16 tensors, in place too.
    d5 = torch.zeros(5, 2, PROMPT_TOKENS, 4, 8, dtype=torch.float16)
    store.fetch(prompt, d5, level=0).wait()
    assert np.allclose(d5.float().view(5, 2, PROMPT_TOKENS, 32).numpy(), level0, rtol=1e-3, atol=1e-3)
    bf = torch.zeros(5, 2, PROMPT_TOKENS, 32, dtype=torch.bfloat16)
    store.fetch(prompt, bf, level=0).wait()
    assert np.allclose(bf.float().numpy(), level0, rtol=1e-2, atol=1e-2)
    half = np.zeros((5, 2, PROMPT_TOKENS, 32), np.float16)
    store.fetch(prompt, half, level=0, max_tokens=130).wait()  # whole chunks only: 128 tokens
    assert np.allclose(half[:, :, :128], level0[:, :, :128], rtol=1e-3, atol=1e-3) and not half[:, :, 128:].any()


def test_refine_after_the_first_token_equals_the_finer_fetch(store, level0, prompt):
    """A progressive store (the profile kvstream-profile builds): a fetch at the
    coarsest level, refined to level 0, holds exactly what a level-0 fetch holds, and
    only the missing bytes moved."""
    coarsest = len(store.levels) - 1
    dest = np.zeros((5, 2, PROMPT_TOKENS, 32), np.float32)
    first = store.fetch(prompt, dest, level=coarsest, refinable=True)
    report = first.wait()
    assert report.tokens == 256
    assert not np.array_equal(dest, level0)
    up = first.refine(0)
    assert up["chunks_refined"] == 4 and up["bytes"] > 0
    assert np.array_equal(dest, level0)
    assert first.refine(0) == {"chunks_refined": 0, "bytes": 0}
    with pytest.raises(kvstream.InvalidArgument):
        store.fetch(prompt, np.zeros_like(dest), level=0).refine(0)


def test_fetch_paged_shuffled_equals_packed(store, level0, model, prompt):
    cache = tl.PagedKVCache(model.config, 64, 16)
    random.Random(11).shuffle(cache.free_blocks)
    table = cache.allocate(len(prompt))
    assert any(b - a != 1 for a, b in zip(table, table[1:]))
    report = store.fetch_paged(prompt, cache.layers, table, 16, level=0).wait()
    assert report.tokens == 256
    assert np.array_equal(tl.gather_packed(cache, table, 256).numpy(), level0[:, :, :256])
    # Positions past the fetched prefix and other blocks stay untouched.
    assert not tl.gather_packed(cache, table, len(prompt))[:, :, 256:].any()
    others = set(range(64)) - set(table)
    assert all(not cache.layers[l][:, b].any() for l in range(5) for b in others)
    # A block table that covers fewer tokens bounds the fetch (whole chunks).
    small = tl.PagedKVCache(model.config, 16, 16)
    report = store.fetch_paged(prompt, small.layers, list(range(9)), level=0).wait()  # 144 slots
    assert report.tokens == 128
    assert np.array_equal(tl.gather_packed(small, list(range(8)), 128).numpy(), level0[:, :, :128])


def test_adaptive_fetch_and_plan(store, stored, prompt, kv):
    plan = store.plan(prompt, timeout=10)
    assert plan.tokens == 256 and plan.fits and len(plan.decisions) == 4
    assert all(d.action == "fetch" for d in plan.decisions)
    dest = np.zeros_like(kv)
    report = store.fetch(prompt, dest, timeout=10).wait()  # no level: the chooser picks, 1% bound
    assert report.tokens == 256 and report.recompute == [] and len(report.chunks) == 4
    assert report.max_quality_loss_pct <= 1.0
    assert all(c.status == "ok" and c.action == "fetch" for c in report.chunks)
    err = np.abs(dest[:, :, :256] - kv[:, :, :256]).mean() / kv.std()
    assert err < 0.2


def test_fetch_holds_its_destination(store, stored, prompt):
    dest = np.zeros((5, 2, PROMPT_TOKENS, 32), np.float32)
    ref = weakref.ref(dest)
    fetch = store.fetch(prompt, dest, level=0)
    del dest
    gc.collect()
    assert ref() is not None  # held by the running fetch
    fetch.wait()
    assert fetch.finished and ref() is None  # released once it ended
    assert fetch.wait().tokens == 256  # waiting again: the same report


@pytest.fixture()
def slow_store(node, tinyllama_profile, stored):
    # ~60 KB at level 0 over a 2 kbit/s paced link: about 4 minutes, so that a fetch
    # on it is still running whenever the test looks, however slow the machine (its
    # fetches are cancelled, never waited out).
    with kvstream.KvStore.open(config(node, tinyllama_profile, **{"storage.paced_bits_per_second": 2e3})) as s:
        yield s


def test_cancel_and_gil_released_while_waiting(slow_store, prompt):
    dest = np.zeros((5, 2, PROMPT_TOKENS, 32), np.float32)
    fetch = slow_store.fetch(prompt, dest, level=0, timeout=600)
    started = threading.Event()
    events: list[str] = []
    count = 0

    def worker() -> None:
        nonlocal count
        started.wait()
        for _ in range(200_000):  # pure Python: runs only while the main thread has let go of the GIL
            count += 1
        events.append("unfinished" if not fetch.finished else "finished")
        events.append("counted")
        fetch.cancel()
        events.append("cancelled")

    thread = threading.Thread(target=worker)
    thread.start()
    started.set()
    # If wait() held the GIL, the worker could not count (nor cancel) before the paced
    # fetch had completed on its own, and wait() would return a report.
    with pytest.raises(kvstream.Cancelled) as e:
        fetch.wait()
    events.append("wait returned")
    thread.join()
    assert count == 200_000 and e.value.code == 9
    assert events == ["unfinished", "counted", "cancelled", "wait returned"]
    # A cancelled fetch's context manager exit and a later wait are quiet / consistent.
    with pytest.raises(kvstream.Cancelled):
        fetch.wait()
    with slow_store.fetch(prompt, dest, level=0, timeout=600) as f:
        pass  # leaving the block cancels it
    assert f.finished


def test_a_full_store_evicts_only_when_asked(tmp_path, tinyllama_profile, model, prompt, kv):
    """A node whose quota the namespace filled: a put raises NoSpace and removes nothing;
    with eviction.when_full it removes the other prompt's deepest chunks and fits."""
    other = prompt[:1] + [(prompt[1] + 1) % 512] + prompt[2:]  # every chunk key differs
    other_kv = exact_kv(model, other)
    with kvstream.Server.start(str(tmp_path / "n"), {"ns": SECRET}) as node:
        with kvstream.KvStore.open(config(node, tinyllama_profile)) as s:
            assert s.put(prompt, kv).evicted_chunks == 0
            # What the quota counts: each object's file in whole allocation units.
            used = node.namespace_usage()["ns"]["stored_bytes"]
            node.set_namespace_quotas(used + used // 2)  # the prompt and about half of another
            with pytest.raises(kvstream.NoSpace) as e:
                s.put(other, other_kv)
            assert e.value.code_name == "no_space" and "quota" in e.value.message
            assert s.lookup(prompt) == 256
        with kvstream.KvStore.open(config(node, tinyllama_profile, **{"eviction.when_full": True})) as s:
            report = s.put(other, other_kv)
            assert report.evicted_chunks > 0 and report.evicted_bytes > 0
            assert s.lookup(other) == 256 and s.lookup(prompt) < 256
            assert node.namespace_usage()["ns"]["stored_bytes"] <= used + used // 2
        assert node.counters()["quota_refusals"] >= 2
        assert node.counters()["use_marks_raised"] > 0  # every put marked its chunks used
        usage = node.namespace_usage()["ns"]
        assert usage["quota_bytes"] == used + used // 2 and 0 < usage["stored_bytes"] <= usage["quota_bytes"]


def test_remove_and_evict(node, tinyllama_profile, model, prompt, kv):
    with kvstream.KvStore.open(config(node, tinyllama_profile, model_id="evict-test")) as s:
        assert s.put(prompt, kv).chunks == 4
        assert s.lookup(prompt) == 256
        assert s.remove(prompt[:130]) == 2  # chunks 0 and 1: the rest is unreachable now
        assert s.lookup(prompt) == 0
        s.put(prompt, kv)
        report = s.evict(max_bytes=1)
        assert report.chunks_removed == 4 and report.bytes_kept == 0
        assert s.lookup(prompt) == 0
