"""The shared-prefix serving example (examples/python/serve_shared_prefix.py) end to
end: a node in this process, the PyTorch stories260K runtime with a paged KV cache,
KvStreamConnector. At level 0 the greedy outputs of requests whose prefix was fetched
equal those from exact KV; the adaptive default runs and reports. No timing is
asserted.
"""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("numpy")
pytest.importorskip("torch", reason="PyTorch is not installed for this python (use Debian's /usr/bin/python3)")
pytest.importorskip("kvstream", reason="the kvstream package is not built (ninja -C build kvstream_python)")

from conftest import data_dir  # noqa: E402
import serve_shared_prefix as serve  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def needs_data():
    if not os.path.exists(os.path.join(data_dir(), "stories260K.bin")):
        pytest.skip(f"tinyllama data not found at {data_dir()} (set KVSTREAM_TINYLLAMA)")


def run(capsys, *args: str) -> dict:
    assert serve.main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_level0_outputs_equal_exact_kv(capsys, tinyllama_profile):
    s = run(capsys, "--requests", "3", "--level", "0", "--profile", tinyllama_profile)
    assert s["mode"] == "level 0" and s["stored_prefix_tokens"] == 384 and len(s["requests"]) == 3
    first, *later = s["requests"]
    assert first["matched_tokens"] == 0 and first["stored_chunks"] == 6 and first["suffix_tokens"] == first["prompt_tokens"]
    for r in later:
        assert r["matched_tokens"] == r["loaded_tokens"] == 384 and not r["fallback"]
        assert r["levels"] == [0] * 6 and r["fetch_bytes"] > 0 and r["stored_chunks"] == 0
        assert r["suffix_tokens"] == r["prompt_tokens"] - 384
    assert all(r["same_output"] for r in s["requests"]), [r["output"] for r in s["requests"]]
    assert len({r["output"] for r in s["requests"]}) == 3  # different suffixes, different stories


def test_adaptive_default_runs_and_reports(capsys, tinyllama_profile):
    s = run(capsys, "--requests", "2", "--profile", tinyllama_profile)
    assert s["mode"] == "adaptive" and s["link_default"] and s["link_mbps"] > 0 and s["ttft_budget_ms"] > 0
    first, second = s["requests"]
    assert first["same_output"] and first["stored_chunks"] == 6
    assert second["matched_tokens"] == 384
    for key in ("fetch_ms", "suffix_prefill_ms", "ttft_ms", "full_prefill_ttft_ms"):
        assert second[key] >= 0
    if second["fallback"]:  # the fetch missed its deadline (a loaded machine): prefilled from text instead
        assert second["fallback"] == "timed_out" and second["loaded_tokens"] == 0 and second["same_output"]
    else:
        assert second["loaded_tokens"] == 384 and len(second["levels"]) == 6
        assert second["quality_loss_pct"] <= 1.0
    # The table form prints too.
    assert serve.main(["--requests", "2", "--profile", tinyllama_profile, "--level", "2"]) == 0
    out = capsys.readouterr().out
    assert "same output" in out and "link" in out


def test_a_full_store_fails_saves_not_requests(capsys, tinyllama_profile):
    """A node quota smaller than a chunk: every save fails NoSpace, and every request is
    served all the same, prefilled from text, with the output exact KV gives."""
    s = run(capsys, "--requests", "2", "--profile", tinyllama_profile, "--level", "0", "--node-quota-bytes", "1000")
    for r in s["requests"]:
        assert r["save_error"] == "no_space" and r["stored_chunks"] == 0 and r["same_output"]
    assert s["requests"][1]["matched_tokens"] == 0
