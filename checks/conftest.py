# Copyright © 2026 Apple Inc.
"""The fork's own deeper checks: recorded parity, long graph runs, launches
over several ranks, soaks, the benchmarks' own checks. They are not part of
any pull request (tests/ holds those) and may use benchmarks/ and the
helpers in this folder."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
