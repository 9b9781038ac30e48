# Copyright © 2026 Apple Inc.
"""Build the distribution mlx-lm: the pinned release, this fork's files and
the patches of its pull requests, in series order (see tools/assemble.py)."""

import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

import assemble  # noqa: E402

# Stale files of an earlier in-tree build must not reach the wheel.
shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)
src = assemble.stage(ROOT / "build" / "fork")
project = assemble.upstream_project()
upstream = assemble.fetch_upstream()

setup(
    name=project["name"],
    version=assemble.VERSION,
    description=project["description"],
    long_description=(upstream / project["readme"]).read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license=project["license"],
    author=project["authors"][0]["name"],
    author_email=project["authors"][0]["email"],
    url=project["urls"]["Homepage"],
    project_urls=project["urls"],
    classifiers=project["classifiers"],
    python_requires=project["requires-python"],
    install_requires=project["dependencies"],
    extras_require=project["optional-dependencies"],
    entry_points={
        "console_scripts": [f"{k} = {v}" for k, v in project["scripts"].items()]
    },
    package_dir={"": os.path.relpath(src, ROOT)},
    packages=find_packages(where=str(src), include=["mlx_lm*"]),
    package_data={"mlx_lm": ["*.md", "py.typed"]},
)
