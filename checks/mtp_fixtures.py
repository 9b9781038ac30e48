# Copyright © 2026 Apple Inc.
"""Tiny DeepSeek-V4 models, folders and a server for the fork's deeper
speculative-decoding checks (test_mtp_deep.py, test_trim_deep.py):
tests/test_deepseek_v4.py's, tests/test_deepseek_v4_mtp.py's block check and
tests/server_fixture.py's fixtures."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from dsv4_fixtures import (  # noqa: E402, F401
    GRAPH_BOUND,
    TINY_CONFIG,
    graph_edges,
    make_tiny_model,
)
from dsv4_fixtures import make_tiny_model_folder as _make_folder  # noqa: E402
from dsv4_fixtures import (  # noqa: E402, F401
    make_tiny_tokenizer,
    max_cache_graph,
    max_diff,
    random_weights,
)
from server_fixture import ServerThread, make_model_provider  # noqa: E402, F401
from test_deepseek_v4_mtp import block_checker  # noqa: E402, F401


def make_tiny_model_folder(path, config=None, seed=0):
    """tests/test_deepseek_v4.py's folder, without the loader's "mtp" in its
    config.json ("mtp" asks the loader for the MTP block: no checkpoint's
    field)."""
    path = _make_folder(path, config, seed)
    config = json.loads((path / "config.json").read_text())
    config.pop("mtp", None)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
