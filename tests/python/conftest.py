"""Shared fixtures of the Python tests: where the build, the tinyllama data and the
codec profile are, and the kvstream package from the build tree.

The build is $KVSTREAM_BUILD_DIR (default <repo>/build); the package is imported
from PYTHONPATH, else from <build>/python. The tinyllama profile is the build's
tinyllama.kvsprofile (`make demo` writes it); when it is absent, kvstream-profile
builds one once per session in a pytest temporary directory (never in the build
tree, which other tests may be writing), or the tests that need it skip.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("KVSTREAM_BUILD_DIR") or os.path.join(REPO, "build")
sys.path.insert(0, os.path.join(REPO, "examples", "python"))
try:
    import kvstream  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(BUILD, "python"))


def data_dir() -> str:
    env = os.environ.get("KVSTREAM_TINYLLAMA")
    return env if env else os.path.normpath(os.path.join(REPO, "..", "shared", "data", "tinyllama"))


@pytest.fixture(scope="session")
def tinyllama_profile(tmp_path_factory) -> str:
    """Path of a codec profile for stories260K (5 layers, 4 KV heads, head_dim 8)."""
    built = os.path.join(BUILD, "tinyllama.kvsprofile")
    if os.path.exists(built):
        return built
    tool = os.path.join(BUILD, "bin", "kvstream-profile")
    if not os.access(tool, os.X_OK):
        pytest.skip(f"no profile at {built} and no kvstream-profile at {tool} to build one "
                    "(build the kvstream-profile target or run `make demo`)")
    if not os.path.exists(os.path.join(data_dir(), "stories260K.bin")):
        pytest.skip(f"tinyllama data not found at {data_dir()} (set KVSTREAM_TINYLLAMA)")
    out = tmp_path_factory.mktemp("profile") / "tinyllama.kvsprofile"
    subprocess.run([tool, "--data", data_dir(), "--out", str(out)], check=True, capture_output=True, timeout=900)
    return str(out)
