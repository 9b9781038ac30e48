# Copyright © 2026 Apple Inc.
"""What setup.py needs to build the fork: the pinned release (fetched by name,
sha256-checked), the series of pull requests (``patches/series.toml``), and
the staging of the package from both. The developer's commands are in
tools/fork.py.

Each pull request of the series has its own folder of patches,
``patches/<name>/<upstream path>.patch``, one unified diff per upstream file
it edits, made against the pinned release with the pull requests it depends
on applied. The series applies them in order; a hunk finds its lines at the
line it names or the nearest line where they all match (no fuzz), as
``patch`` does.
"""

import difflib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

UPSTREAM_NAME = "mlx-lm"
UPSTREAM_VERSION = "0.32.2"
UPSTREAM_SDIST_SHA256 = (
    "1af8a92f6a141c3e2bf5b0369ac4464203a8e2189c47b9e40d3e921e5b3a1fe9"
)
LOCAL_LABEL = "fork"
VERSION = f"{UPSTREAM_VERSION}+{LOCAL_LABEL}"

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "patches"
CACHE = Path(
    os.environ.get("MLX_LM_FORK_CACHE", Path.home() / ".cache" / "mlx-lm-fork")
)


class ForkError(Exception):
    pass


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_upstream():
    """Return the extracted source tree of the pinned release.

    The sdist is downloaded by package name with pip (any index pip is set up
    for), checked against ``UPSTREAM_SDIST_SHA256`` and cached. Set
    ``MLX_LM_FORK_SDIST`` to a local copy of the sdist to skip the download.
    """
    tree = CACHE / f"mlx_lm-{UPSTREAM_VERSION}"
    stamp = tree / ".sha256"
    if stamp.is_file() and stamp.read_text() == UPSTREAM_SDIST_SHA256:
        return tree

    archive = os.environ.get("MLX_LM_FORK_SDIST")
    with tempfile.TemporaryDirectory() as tmp:
        if archive is None:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary=:all:",
                "--dest",
                tmp,
                f"{UPSTREAM_NAME}=={UPSTREAM_VERSION}",
            ]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise ForkError(
                    f"could not download {UPSTREAM_NAME}=={UPSTREAM_VERSION}:\n"
                    + result.stderr
                )
            archive = next(Path(tmp).glob("*.tar.gz"))
        digest = _sha256(archive)
        if digest != UPSTREAM_SDIST_SHA256:
            raise ForkError(
                f"{archive}: sha256 {digest} does not match the pinned "
                f"{UPSTREAM_SDIST_SHA256}"
            )
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=CACHE))
        shutil.move(unpacked / f"mlx_lm-{UPSTREAM_VERSION}", staging / "tree")
        (staging / "tree" / ".sha256").write_text(digest)
        shutil.rmtree(tree, ignore_errors=True)
        os.replace(staging / "tree", tree)
        shutil.rmtree(staging)
    return tree


def upstream_project():
    """The ``[project]`` table of the pinned release's pyproject.toml."""
    with open(fetch_upstream() / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _files(top):
    """Relative paths of the files below ``top``, without caches."""
    if not top.is_dir():
        return []
    return sorted(
        p.relative_to(top)
        for p in top.rglob("*")
        if (p.is_file() or p.is_symlink())
        and "__pycache__" not in p.parts
        and p.suffix != ".pyc"
    )


def fork_files():
    """Files that this fork adds to the ``mlx_lm`` package."""
    return [Path("mlx_lm") / p for p in _files(ROOT / "mlx_lm")]


# ----------------------------------------------------------------------------
# The series


class PR:
    """One pull request of the series, as ``patches/series.toml`` gives it."""

    def __init__(self, entry, order):
        self.name = entry["name"]
        self.title = entry["title"]
        self.depends = list(entry.get("depends", []))
        self.files = [Path(f) for f in entry.get("files", [])]
        self.tests = list(entry.get("tests", []))
        self.track = entry.get("track")
        self.order = order

    @property
    def folder(self):
        return PATCHES / self.name

    def patches(self, part=None):
        """This PR's patch files: all, or those of ``mlx_lm`` or ``tests``."""
        top = self.folder / part if part else self.folder
        return sorted(top.rglob("*.patch")) if top.is_dir() else []

    def __repr__(self):
        return f"PR({self.name!r})"


TRACKS = ("upstream", "fork")


def series():
    """The pull requests of ``patches/series.toml``, in series order. A PR
    may depend only on PRs before it."""
    manifest = PATCHES / "series.toml"
    if not manifest.is_file():
        raise ForkError(f"{manifest} is missing")
    with open(manifest, "rb") as f:
        entries = tomllib.load(f).get("pr", [])
    prs, seen = [], {}
    for i, entry in enumerate(entries):
        pr = PR(entry, i)
        if pr.name in seen:
            raise ForkError(f"series.toml: PR {pr.name!r} is listed twice")
        if pr.track not in TRACKS:
            raise ForkError(
                f"series.toml: {pr.name!r} has track {pr.track!r}, not one of "
                f"{', '.join(map(repr, TRACKS))}"
            )
        for dep in pr.depends:
            if dep not in seen:
                raise ForkError(
                    f"series.toml: {pr.name!r} depends on {dep!r}, which is "
                    "not a PR before it"
                )
        seen[pr.name] = pr.track
        prs.append(pr)
    return prs


def track(prs, name):
    """The PRs of track ``name`` with the PRs they depend on, in series order."""
    if name not in TRACKS:
        raise ForkError(f"no track {name!r} (tracks: {', '.join(TRACKS)})")
    return closure(prs, [p.name for p in prs if p.track == name])


def closure(prs, names):
    """The PRs named and every PR they depend on, in series order."""
    by_name = {p.name: p for p in prs}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ForkError(
            f"no PR named {', '.join(unknown)} in patches/series.toml "
            f"(PRs: {', '.join(by_name)})"
        )
    want, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in want:
            want.add(name)
            todo += by_name[name].depends
    return [p for p in prs if p.name in want]


def patch_files(part=None, prs=None):
    """Every PR's patch files in series order: all, or those of ``mlx_lm``
    or ``tests``."""
    return [p for pr in (series() if prs is None else prs) for p in pr.patches(part)]


def target_of(patch):
    """The upstream file a patch edits: its path below its PR's folder."""
    rel = Path(patch).resolve().relative_to(PATCHES.resolve())
    return Path(*rel.parts[1:]).with_suffix("")


def base_text(rel):
    """The text the patches of ``rel`` start from: the pinned release's file,
    or, for a file an earlier PR adds, the repository's."""
    upstream = fetch_upstream() / rel
    return (upstream if upstream.is_file() else ROOT / rel).read_text()


def patch_path(pr, rel):
    return PATCHES / pr / (str(rel) + ".patch")


# ----------------------------------------------------------------------------
# Unified diffs


def make_patch(rel, old, new, context=3):
    """A unified diff of one file, in the form ``apply_patch`` reads. Where
    another PR edits lines next to this one's, fewer lines of ``context``
    let both apply in either order."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{rel}",
        tofile=f"b/{rel}",
        n=context,
    )
    return "".join(lines)


def parse_hunks(text):
    """The hunks of a one-file unified diff: (old start, old lines, new
    lines), the lines with their ends."""
    hunks = []
    for line in text.splitlines(keepends=True):
        if line.startswith("@@"):
            start = line.split()[1][1:].split(",")[0]
            hunks.append((int(start), [], []))
        elif hunks and line[:1] in (" ", "-", "+"):
            body = line[1:]
            if line[0] in " -":
                hunks[-1][1].append(body)
            if line[0] in " +":
                hunks[-1][2].append(body)
        elif hunks and line.startswith("\\"):
            for side in hunks[-1][1:]:
                if side and side[-1].endswith("\n"):
                    side[-1] = side[-1][:-1]
    return hunks


def _find(lines, old, want, pos):
    """The index nearest ``want`` (and not before ``pos``) where ``old``
    matches ``lines``, or None."""
    last = len(lines) - len(old)
    for d in range(len(lines) + 1):
        for at in (want - d, want + d) if d else (want,):
            if pos <= at <= last and lines[at : at + len(old)] == old:
                return at
        if want - d < pos and want + d > last:
            return None
    return None


def apply_text(text, patch_text, name="patch", reverse=False):
    """Apply a one-file unified diff to ``text``: return the new text and the
    problems, one per hunk that does not apply (the others still apply)."""
    lines = text.splitlines(keepends=True)
    out, pos, offset, problems = [], 0, 0, []
    for n, (start, old, new) in enumerate(parse_hunks(patch_text), 1):
        if reverse:
            old, new = new, old
        # "-N,0" (no old lines) inserts after line N.
        want = start + offset - (1 if old else 0)
        at = _find(lines, old, want, pos)
        if at is None:
            problems.append(f"{name}: hunk no.{n} (@@ -{start}) doesn't match")
            continue
        out += lines[pos:at] + new
        pos = at + len(old)
        offset = at - start + (1 if old else 0)
    return "".join(out + lines[pos:]), problems


def apply_patch(patch, root):
    """Apply one patch file onto the tree ``root``. Returns a list of
    problems (empty on success), each naming the patch file and the hunk that
    does not apply; the hunks that apply are written."""
    patch = Path(patch)
    text = patch.read_text()
    target = Path(root) / target_of(patch)
    if not text.startswith("--- ") or "@@" not in text:
        return [f"{patch}: not a unified diff"]
    if not target.is_file():
        return [f"{patch}: {target_of(patch)} does not exist in {root}"]
    new, problems = apply_text(target.read_text(), text, str(patch))
    if target.is_symlink():
        target.unlink()
    target.write_text(new)
    return problems


# ----------------------------------------------------------------------------
# Staging


def stage(dest, link=False, prs=None):
    """Write the assembled package to ``dest/mlx_lm``, upstream's test suite
    with the PRs' test patches applied to ``dest/tests``, and return ``dest``.
    ``prs``: the pull requests to apply (default: the whole series).

    With ``link=True`` the fork's own files are symlinks into this repository,
    so that edits to them are live without staging again.
    """
    dest = Path(dest)
    upstream = fetch_upstream()
    shutil.rmtree(dest / "mlx_lm", ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(
        upstream / "mlx_lm",
        dest / "mlx_lm",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    if prs is None:
        prs = series()
        owned = {f for pr in prs for f in pr.files}
        stray = [f for f in fork_files() if f not in owned]
        if stray:
            raise ForkError(
                "files in no PR of patches/series.toml: " + ", ".join(map(str, stray))
            )
    for rel in [f for pr in prs for f in pr.files if f.parts[0] == "mlx_lm"]:
        if (upstream / rel).exists():
            raise ForkError(
                f"{rel} is a file of upstream mlx-lm {UPSTREAM_VERSION}: "
                "edit it through a patch of patches/<pr>/"
            )
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if link:
            out.symlink_to(ROOT / rel)
        else:
            shutil.copyfile(ROOT / rel, out)
    problems = []
    for patch in patch_files("mlx_lm", prs):
        problems += apply_patch(patch, dest)
    if problems:
        raise ForkError("patches do not apply:\n  " + "\n  ".join(problems))
    (dest / "mlx_lm" / "_version.py").write_text(f"__version__ = {VERSION!r}\n")
    stage_tests(dest, prs)
    return dest


def stage_tests(dest, prs=None):
    """Write upstream's test suite, with the PRs' test patches applied, to
    ``dest/tests`` and return that folder."""
    tests = Path(dest) / "tests"
    shutil.rmtree(tests, ignore_errors=True)
    shutil.copytree(
        fetch_upstream() / "tests", tests, ignore=shutil.ignore_patterns("__pycache__")
    )
    problems = []
    for patch in patch_files("tests", prs):
        problems += apply_patch(patch, dest)
    if problems:
        raise ForkError("patches do not apply:\n  " + "\n  ".join(problems))
    return tests
