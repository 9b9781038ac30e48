# Copyright © 2026 Apple Inc.
"""The developer's commands for this fork of mlx-lm.

The fork is a series of pull requests against the pinned release
(``patches/series.toml``): each has its new files (upstream layout, under
``mlx_lm/`` and ``tests/``) and its patches, ``patches/<pr>/<path>.patch``,
one unified diff per upstream file it edits, made against the release with
the PRs it depends on applied. What the build needs (fetch the release, read
the series, stage the package) is in tools/assemble.py, which setup.py uses.

Commands (``python tools/fork.py <command> --help`` for details):

  demo     set up the dev venv and run a long decode on a tiny model
  tiny-model  write a tiny random model folder that mlx_lm's commands load
  stage    write the assembled ``mlx_lm`` package into a folder
  dev      set up (or refresh) the development tree and venv
  diff     turn edits in the dev tree back into the PRs' patches (--pr NAME)
  export   apply the fork, or one PR with its dependencies, onto an upstream tree
  series   the PRs with their sizes; check that each applies alone
  test-prs each PR alone on the release with its own tests
  lint     black, isort and ruff on every file the fork adds or changes
  differential  the fork beside pristine 0.32.2 on tiny models, compared
  test     install from git into a fresh venv and run every check
  upstream-tests  run the pinned release's own test suite against mlx_lm
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import assemble  # noqa: E402
import differential  # noqa: E402
from assemble import (  # noqa: E402
    UPSTREAM_NAME,
    UPSTREAM_VERSION,
    VERSION,
    ForkError,
    apply_patch,
    apply_text,
    base_text,
    closure,
    fetch_upstream,
    make_patch,
    patch_files,
    patch_path,
    series,
    stage,
    stage_tests,
    target_of,
    upstream_project,
)

ROOT = assemble.ROOT
DEV_TREE = ROOT / "build" / "dev"
DEV_VENV = ROOT / ".venv"

# What `demo` passes on to benchmarks/long_decode.py (test_fork checks the
# list against its parser).
DEMO_OPTIONS = """\
Options after `--` go on to benchmarks/long_decode.py:
  --model-type {deepseek_v4,qwen3_5,llama,qwen3}
                        the tiny model to build (default deepseek_v4)
  --model DIR           an existing model folder instead
  --tokens N            tokens to decode (default 3000)
  --report N            print a line every N tokens (default 500)
  --blocking-eval       also mx.eval every cache array after each forward (a
                        host sync per step), to compare tokens/s

  python3 tools/fork.py demo -- --model-type qwen3_5 --tokens 500
"""
# The model types of benchmarks/long_decode.py's CONFIGS.
TINY_MODEL_TYPES = ("deepseek_v4", "qwen3_5", "llama", "qwen3")

# The pinned release's own suite on Linux, mlx[cpu], offline (see
# tools/upstream-not-passing.txt).
PRISTINE_SUITE = "242 passed, 16 skipped, 27 failed, 85 errors"

# Linters pinned as in upstream's pre-commit configuration.
LINT_REQUIREMENTS = ["black==25.1.0", "isort==6.0.1", "ruff==0.17.6"]
# What the server tests drive mlx_lm.server with and measure it by.
TEST_CLIENTS = ["openai", "psutil", "requests"]
# mlx-vlm's wheel, unpacked (not installed: it would replace mlx_lm), for
# checks/test_mtp_mlx_vlm.py.
MLX_VLM = "mlx-vlm==0.7.10"
MLX_VLM_SHA256 = "f112ddaaf1bf0dd1efa702b5675a27df3345614e69e3996d3fbd09d838b8333d"


def _files(top):
    return assemble._files(top)


def fork_files():
    return assemble.fork_files()


# ----------------------------------------------------------------------------
# The series


def _touching(prs, rel):
    """The PRs that edit the upstream file ``rel``, in series order."""
    return [p for p in prs if patch_path(p.name, rel).is_file()]


def _apply_all(text, rel, prs, name="series"):
    """``text`` with the patches of ``prs`` to ``rel`` applied in order."""
    for p in _touching(prs, rel):
        text, problems = apply_text(text, patch_path(p.name, rel).read_text(), name)
        if problems:
            raise ForkError(f"{p.name}: " + "; ".join(problems))
    return text


def series_text(rel, prs=None):
    """The upstream file ``rel`` as the series (or ``prs``) makes it."""
    prs = series() if prs is None else prs
    return _apply_all(base_text(rel), rel, prs)


def route_edit(rel, text, owner, prs=None):
    """Write ``text`` (the dev tree's ``rel``) back into PR ``owner``'s patch
    of ``rel``: the other PRs' patches are taken off the text, the rest is
    the owner's against its dependencies. PRs that depend on the owner get
    their patches of ``rel`` made again on top of it. Returns the patch files
    written or removed."""
    prs = series() if prs is None else prs
    by_name = {p.name: p for p in prs}
    if owner not in by_name:
        raise ForkError(
            f"no PR named {owner!r} in patches/series.toml "
            f"(PRs: {', '.join(by_name)})"
        )
    mine = closure(prs, [owner])
    if rel in by_name[owner].files:
        raise ForkError(f"{rel} is {owner}'s own file: edit it in the repository")
    upstream = base_text(rel)
    before = series_text(rel, prs)
    target = text
    for p in reversed([p for p in _touching(prs, rel) if p not in mine]):
        target, problems = apply_text(
            target, patch_path(p.name, rel).read_text(), reverse=True
        )
        if problems:
            # A later PR's context overlaps the edit: apply the edit itself
            # to the owner's text instead.
            own = _apply_all(upstream, rel, mine)
            target, problems = _apply_edit(rel, before, text, own)
            if problems:
                raise ForkError(
                    f"the edit of {rel} overlaps lines of PR {p.name}: make it "
                    f"there (`diff --pr {p.name}`) or split it"
                )
            break
    base = _apply_all(upstream, rel, [p for p in mine if p.name != owner])
    old = {p.name: patch_path(p.name, rel) for p in prs}
    saved = {n: f.read_text() for n, f in old.items() if f.is_file()}
    # The PRs after the owner that build on it: their targets, made again.
    later = [
        p
        for p in _touching(prs, rel)
        if p.name != owner and owner in {d.name for d in closure(prs, [p.name])}
    ]
    old_texts = {
        q.name: _apply_all(upstream, rel, closure(prs, [q.name])) for q in later
    }
    for context in (3, 2, 1, 0):
        try:
            _write_patch(old[owner], rel, base, target, context)
            for q in later:
                # Rebased on the owner's new text, with q's own edits kept;
                # where q's context holds the edited lines, q's text edited.
                deps = [d for d in closure(prs, [q.name]) if d is not q]
                qbase = _apply_all(upstream, rel, deps)
                qtarget, problems = apply_text(qbase, saved[q.name])
                if problems:
                    qtarget, problems = _apply_edit(
                        rel, before, text, old_texts[q.name]
                    )
                if problems:
                    raise ForkError(f"{q.name}: " + "; ".join(problems))
                _write_patch(old[q.name], rel, qbase, qtarget, _context(saved[q.name]))
            if series_text(rel, prs) == text:
                return [
                    ("wrote " if f.is_file() else "removed ") + str(f.relative_to(ROOT))
                    for n, f in old.items()
                    if saved.get(n) != (f.read_text() if f.is_file() else None)
                ]
        except ForkError:
            pass
        for n, f in old.items():
            if n in saved:
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(saved[n])
            elif f.is_file():
                f.unlink()
    raise ForkError(
        f"the patches of {rel} cannot be made so that the series gives the "
        f"dev tree's text with the edit in {owner}"
    )


def _apply_edit(rel, before, text, old_text):
    """``old_text`` with the dev tree's edit applied: the difference between
    the series' text ``before`` and ``text``, with as much context as
    applies. Returns (new text, problems)."""
    for context in (3, 2, 1, 0):
        new, problems = apply_text(old_text, make_patch(rel, before, text, context))
        if not problems:
            break
    return new, problems


def _context(patch_text):
    """The lines of context a patch was made with (at most 3)."""
    counts, lead = [0], None
    for line in patch_text.splitlines():
        if line.startswith("@@"):
            lead = 0
        elif lead is not None and line.startswith(" "):
            lead += 1
            counts.append(lead)
        else:
            lead = None
    return min(max(counts), 3)


def _write_patch(path, rel, old, new, context):
    if old == new:
        if path.is_file():
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(make_patch(rel, old, new, context))


def patch_counts(pr, patch):
    """Lines added and removed by one patch of ``pr``, as ``git diff`` counts
    them on the exported PR (difflib's patch may count a moved line twice)."""
    rel = target_of(patch)
    prs = series()
    deps = [p for p in closure(prs, [pr.name]) if p.name != pr.name]
    base = _apply_all(assemble.base_text(rel), rel, deps)
    new = _apply_all(base, rel, [p for p in prs if p.name == pr.name])
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        a.write_text(base)
        b.write_text(new)
        out = subprocess.run(
            ["git", "diff", "--no-index", "--numstat", str(a), str(b)],
            capture_output=True,
            text=True,
        ).stdout.split()
    if len(out) >= 2 and out[0].isdigit():
        return int(out[0]), int(out[1])
    text = patch.read_text().splitlines()
    plus = sum(1 for x in text if x.startswith("+") and not x.startswith("+++"))
    minus = sum(1 for x in text if x.startswith("-") and not x.startswith("---"))
    return plus, minus


def pr_size(pr):
    """Files, lines added and removed of one PR (its patches and new files)."""
    files, added, removed = len(pr.files), 0, 0
    for f in pr.files:
        added += len((ROOT / f).read_text().splitlines())
    for patch in pr.patches():
        files += 1
        plus, minus = patch_counts(pr, patch)
        added += plus
        removed += minus
    return files, added, removed


def check_series(prs=None):
    """Every PR's patches apply onto the pinned release with only its
    dependencies applied, and every hunk and new file of the fork is in
    exactly one PR. Returns the problems."""
    prs = series() if prs is None else prs
    problems = []
    owners = {}
    for p in prs:
        for f in p.files:
            owners.setdefault(f, []).append(p.name)
            if not (ROOT / f).is_file():
                problems.append(f"{p.name}: {f} does not exist")
    new = fork_files() + [Path("tests") / f for f in _files(ROOT / "tests")]
    for f in new:
        if len(owners.get(f, [])) != 1:
            problems.append(f"{f} is in {len(owners.get(f, []))} PRs: {owners.get(f)}")
    for f, names in owners.items():
        if f not in new and len(names) == 1:
            problems.append(
                f"{names[0]}: {f} is not a new file under mlx_lm/ or tests/"
            )
    upstream = fetch_upstream()
    for patch in sorted(assemble.PATCHES.rglob("*.patch")):
        name = patch.relative_to(assemble.PATCHES).parts[0]
        if name not in {p.name for p in prs}:
            problems.append(f"{patch}: in no PR of series.toml")
    problems += check_tracks(prs)
    for p in prs:
        deps = [d for d in closure(prs, [p.name]) if d is not p]
        for patch in p.patches():
            rel = target_of(patch)
            # A later PR may edit a file that one of its dependencies adds.
            added = any(rel in d.files for d in deps)
            if not (upstream / rel).is_file() and not added:
                problems.append(
                    f"{patch}: {rel} is not a file of {UPSTREAM_VERSION} "
                    "nor of a PR it depends on"
                )
                continue
            try:
                base = _apply_all(base_text(rel), rel, deps)
            except ForkError as e:
                problems.append(f"{p.name}: a dependency does not apply: {e}")
                continue
            _, bad = apply_text(base, patch.read_text(), str(patch))
            problems += bad
    return problems


def check_tracks(prs):
    """An upstream-track PR depends only on PRs of its track, and no later
    PR of the track patches a file it adds (its code is final when it lands).
    Returns the problems."""
    by_name = {p.name: p for p in prs}
    problems = []
    added = {}
    for p in prs:
        if p.track != "upstream":
            continue
        for dep in p.depends:
            if by_name[dep].track != "upstream":
                problems.append(
                    f"{p.name}: an upstream-track PR depends on {dep}, of the "
                    f"{by_name[dep].track} track"
                )
        for patch in p.patches():
            rel = target_of(patch)
            if rel in added:
                problems.append(
                    f"{p.name}: patches {rel}, which {added[rel]} adds: a later "
                    "upstream-track PR rewrites an earlier one"
                )
        added.update((f, p.name) for f in p.files)
    return problems


# ----------------------------------------------------------------------------
# Development tree


def _dev_files():
    """The dev tree's package files, and those of upstream's tests (only
    upstream's own test files become patches; the fork's are in tests/)."""
    upstream = fetch_upstream()
    files = [Path("mlx_lm") / p for p in _files(DEV_TREE / "mlx_lm")]
    tests = [Path("tests") / p for p in _files(DEV_TREE / "tests")]
    return files + [p for p in tests if (upstream / p).is_file()]


def _pending_edits():
    """Upstream files edited in the dev tree whose patches do not give them,
    and new files not yet moved into the repository."""
    upstream = fetch_upstream()
    prs = series()
    pending = []
    for rel in _dev_files():
        path = DEV_TREE / rel
        if rel.name == "_version.py" or path.is_symlink():
            continue
        if not (upstream / rel).is_file() and not _touching(prs, rel):
            pending.append(rel)
        elif path.read_text() != series_text(rel, prs):
            pending.append(rel)
    return pending


def sync_patches(pr=None):
    """Write edits of the dev tree back: into the patches of the PR that
    edits the file (``pr`` where several do, or none yet), and new files
    moved into the repository (replaced by a link). Returns what changed."""
    prs = series()
    upstream = fetch_upstream()
    changed = []
    for rel in _pending_edits():
        path = DEV_TREE / rel
        if not (upstream / rel).is_file() and not _touching(prs, rel):
            owner = pr
            if owner is None:
                raise ForkError(
                    f"{rel} is a new file: say which PR adds it with "
                    "`diff --pr NAME` (PRs: " + ", ".join(p.name for p in prs) + ")"
                )
            closure(prs, [owner])
            (ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, ROOT / rel)
            path.symlink_to(ROOT / rel)
            add_file_to_manifest(owner, rel)
            changed.append(f"new file {rel} (PR {owner})")
            continue
        touching = [p.name for p in _touching(prs, rel)]
        owner = pr
        if owner is None:
            if len(touching) != 1:
                which = (
                    f"PRs {', '.join(touching)} edit it"
                    if touching
                    else "no PR edits it yet"
                )
                raise ForkError(
                    f"{rel}: {which}; say which PR takes the edit with "
                    "`diff --pr NAME`"
                )
            owner = touching[0]
        changed += route_edit(rel, path.read_text(), owner, prs)
    return changed


def add_file_to_manifest(pr, rel):
    """Add a new file to the ``files`` of ``pr`` in patches/series.toml."""
    manifest = assemble.PATCHES / "series.toml"
    lines = manifest.read_text().splitlines(keepends=True)
    at = next(i for i, l in enumerate(lines) if l.strip() == f'name = "{pr}"')
    files = next(i for i in range(at, len(lines)) if lines[i].startswith("files = "))
    line = lines[files]
    if line.rstrip().endswith("]") and line.strip() != "files = [":
        items = line.strip()[len("files = [") : -1]
        items = (items + ", " if items.strip() else "") + f'"{rel}"'
        lines[files] = f"files = [{items}]\n"
    else:
        lines.insert(files + 1, f'    "{rel}",\n')
    manifest.write_text("".join(lines))


def _venv_python(venv):
    return Path(venv) / "bin" / "python"


def _run(*cmd, **kwargs):
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(list(map(str, cmd)), check=True, **kwargs)


def dev_requirements():
    """What the dev venv needs: the release's dependencies, the cpu extra
    where there is no Metal, and the tools of the test command."""
    project = upstream_project()
    reqs = list(project["dependencies"])
    if sys.platform != "darwin":
        reqs += project["optional-dependencies"]["cpu"]
    reqs += ["pytest", *TEST_CLIENTS, *LINT_REQUIREMENTS]
    return reqs


def _make_venv(venv):
    python = _venv_python(venv)
    _run(sys.executable, "-m", "venv", venv)
    _run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    _run(python, "-m", "pip", "install", "--quiet", *dev_requirements())
    return python


def setup_dev(force=False, venv=DEV_VENV):
    """Stage the dev tree (fork files linked) and point a venv at it."""
    pending = _pending_edits() if (DEV_TREE / "mlx_lm").is_dir() else []
    if pending and not force:
        raise ForkError(
            "the dev tree has edits that are not in patches/ or the repository "
            "yet; run `python tools/fork.py diff` first (or pass --force to drop "
            "them):\n  " + "\n  ".join(map(str, pending))
        )
    stage(DEV_TREE, link=True)
    python = _venv_python(venv)
    if not python.exists():
        _make_venv(venv)
    if not (Path(venv) / "bin" / "mlx_lm").exists():
        # The built fork gives the venv its console scripts; the .pth below
        # puts the dev tree in front of it.
        _run(python, "-m", "pip", "install", "--quiet", "--no-deps", ROOT)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "mlx_lm_fork_dev.pth").write_text(
        f"import sys; sys.path.insert(0, {str(DEV_TREE)!r})\n"
    )
    return python


# ----------------------------------------------------------------------------
# Export onto an upstream tree


def export(tree, pr=None, track=None):
    """Copy the fork's files into an upstream source tree and apply the
    patches there: of every PR, of PR ``pr``, or of the PRs of ``track``,
    with the PRs they depend on. Returns the conflicts, one per file and
    hunk."""
    tree = Path(tree)
    if not (tree / "mlx_lm" / "__init__.py").is_file():
        raise ForkError(f"{tree} is not an mlx-lm source tree (no mlx_lm/)")
    prs = series()
    if pr is not None:
        prs = closure(prs, [pr])
    if track is not None:
        prs = assemble.track(prs, track)
    problems = []
    for rel in [f for p in prs for f in p.files]:
        out = tree / rel
        if out.exists():
            problems.append(f"{rel}: exists in {tree}; not overwritten")
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, out)
    for patch in patch_files(prs=prs):
        problems += apply_patch(patch, tree)
    return problems


# ----------------------------------------------------------------------------
# Checks


def lint_files(tree):
    """Paths in ``tree`` of every Python file the fork adds or changes."""
    files = [p for p in fork_files() if p.suffix == ".py"]
    files += [target_of(p) for p in patch_files() if p.name.endswith(".py.patch")]
    files = sorted(set(files))
    files = [Path(tree) / p for p in sorted(files)]
    files += sorted((ROOT / "tests").rglob("*.py"))
    files += sorted((ROOT / "checks").rglob("*.py"))
    files += sorted((ROOT / "benchmarks").rglob("*.py"))
    files += sorted((ROOT / "tools").rglob("*.py")) + [ROOT / "setup.py"]
    return files


def lint(python=sys.executable):
    with tempfile.TemporaryDirectory() as tmp:
        tree = stage(tmp)
        files = [str(f) for f in lint_files(tree)]
        config = str(fetch_upstream() / "pyproject.toml")
        # In upstream's tree all of mlx_lm is first party; here only the
        # fork's part of it is found in the checkout.
        isort = ["-m", "isort", "--check-only", "--profile", "black", "--quiet"]
        isort += ["-p", "mlx_lm"]
        failed = False
        for cmd, paths in (
            (["-m", "black", "--check"], files),
            (isort, files),
            (["-m", "ruff", "check", "--quiet", "--config", config], files),
            (
                ["-m", "ruff", "check", "--quiet", "--preview", "--config", config],
                files,
            ),
        ):
            if not paths:
                continue
            r = subprocess.run([python, *cmd, *paths], capture_output=True, text=True)
            if r.returncode != 0:
                failed = True
                print(" ".join(cmd[1:3]), "failed:")
                print((r.stdout + r.stderr).replace(tmp, "<staged>"))
        print(f"lint: {len(files)} files, {'FAILED' if failed else 'clean'}")
        return not failed


def not_passing():
    """The upstream tests listed in tools/upstream-not-passing.txt, with why."""
    reasons, reason = {}, None
    for line in (ROOT / "tools" / "upstream-not-passing.txt").read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            reason = line[1:-1]
        elif line and not line.startswith("#"):
            reasons[line] = reason
    return reasons


def upstream_tests(python=sys.executable, pytest_args=()):
    """Run the pinned release's own test suite against the ``mlx_lm`` that
    ``python`` imports. Every test not listed in upstream-not-passing.txt must
    pass."""
    import xml.etree.ElementTree as ET

    with tempfile.TemporaryDirectory() as tmp:
        tests = stage_tests(tmp)
        report = Path(tmp) / "report.xml"
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        cmd = [python, "-m", "pytest", "-q", "--tb=no", "-p", "no:cacheprovider"]
        cmd += ["--junitxml", str(report), *pytest_args, "."]
        print("+", " ".join(map(str, cmd)), f"(in the {UPSTREAM_VERSION} tests)")
        # pytest counts failing subtests as failures too; the report does not.
        subfailed = 0
        with subprocess.Popen(
            cmd, cwd=tests, env=env, stdout=subprocess.PIPE, text=True
        ) as run:
            for line in run.stdout:
                print(line, end="", flush=True)
                subfailed += line.startswith("SUBFAIL")
        outcomes = {}
        for case in ET.parse(report).iter("testcase"):
            if "." not in case.get("classname", ""):
                continue  # a deselected module's placeholder
            module, cls = case.get("classname").split(".", 1)
            test = f"{module}.py::{cls}::{case.get('name')}"
            tags = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
            outcomes[test] = tags[0] if tags else "passed"
    listed = not_passing()
    regressions = sorted(
        t for t, o in outcomes.items() if o != "passed" and t not in listed
    )
    fixed = sorted(t for t in listed if outcomes.get(t) == "passed")
    counts, reasons = {}, {}
    for t, o in outcomes.items():
        counts[o] = counts.get(o, 0) + 1
        if o != "passed" and t in listed:
            reasons[listed[t]] = reasons.get(listed[t], 0) + 1
    failed = counts.get("failure", 0)
    print(
        f"upstream {UPSTREAM_VERSION} suite: {counts.get('passed', 0)} passed, "
        f"{counts.get('skipped', 0)} skipped, {failed + subfailed} failed "
        f"({failed} tests and {subfailed} of their subtests), "
        f"{counts.get('error', 0)} errors"
    )
    if reasons:
        print(
            f"  The {sum(reasons.values())} tests that do not pass are the ones "
            f"that do not pass on the pristine {UPSTREAM_VERSION} here either "
            f"({PRISTINE_SUITE} there; more pass here when patches/tests/ adds "
            "cases), listed with the reason in tools/upstream-not-passing.txt:"
        )
    for reason, n in reasons.items():
        print(f"  {n:5}  {reason}")
    for t in fixed:
        print(f"passes although listed ({listed[t]}): {t}")
    for t in regressions:
        print(f"REGRESSION ({outcomes[t]}): {t}")
    if pytest_args:
        return not regressions
    missing = sorted(t for t in listed if t not in outcomes)
    for t in missing:
        print(f"MISSING listed test: {t}")
    return not regressions and not missing


def print_series(prs=None, track=None):
    """The series as a table: order, name, track, dependencies, size; only
    the PRs of ``track`` if given, with their total."""
    prs = series() if prs is None else prs
    if track is not None:
        assemble.track(prs, track)
        prs = [p for p in prs if p.track == track]
    head = f"{'#':>2}  {'PR':26} {'track':8} {'files':>5} {'+':>6} {'-':>5}"
    print(f"{head}  depends on")
    totals = [0, 0, 0]
    for p in prs:
        size = pr_size(p)
        totals = [t + s for t, s in zip(totals, size)]
        files, added, removed = size
        deps = ", ".join(p.depends) or "-"
        print(
            f"{p.order + 1:>2}  {p.name:26} {p.track:8} {files:>5} {added:>6} "
            f"{removed:>5}  {deps}"
        )
    files, added, removed = totals
    label = f"{len(prs)} PRs"
    print(f"{'':>2}  {label:26} {'':8} {files:>5} {added:>6} {removed:>5}")


SHEETS = ROOT / "docs" / "upstream"
SHEET_BEGIN = "<!-- tools/fork.py series --sheets: begin -->"
SHEET_END = "<!-- tools/fork.py series --sheets: end -->"


def sheet_block(pr, prs):
    """The facts of a PR's sheet that the series gives: dependencies, size,
    files (lines added/removed each) and tests."""
    files, added, removed = pr_size(pr)
    deps = ", ".join(f"[{d}]({d}.md)" for d in pr.depends) or "nothing"
    lines = [
        SHEET_BEGIN,
        f"**{pr.title}**",
        f"Depends on: {deps}. Size: {files} files, +{added} / -{removed} lines.",
        "",
        "| file | change | + | - |",
        "|---|---|---:|---:|",
    ]
    for f in pr.files:
        n = len((ROOT / f).read_text().splitlines())
        lines.append(f"| `{f}` | new | {n} | 0 |")
    for patch in pr.patches():
        hunks = sum(1 for x in patch.read_text().splitlines() if x.startswith("@@"))
        plus, minus = patch_counts(pr, patch)
        lines.append(f"| `{target_of(patch)}` | {hunks} hunks | {plus} | {minus} |")
    tests = [t for t in pr.tests if not t.startswith("-")]
    lines += ["", "Tests: `python -m pytest " + " ".join(tests) + "`"]
    lines.append(SHEET_END)
    return "\n".join(lines) + "\n"


INDEX = SHEETS / "README.md"
INDEX_BEGIN = "<!-- tools/fork.py series --sheets: index begin -->"
INDEX_END = "<!-- tools/fork.py series --sheets: index end -->"
VERDICT = re.compile(r"\*\*(merge as is|small changes|rework|decline)\*\*")


def review_verdict(pr):
    """The last verdict in the "## Review" section of a PR's sheet."""
    sheet = SHEETS / f"{pr.name}.md"
    text = sheet.read_text() if sheet.is_file() else ""
    _, _, review = text.partition("\n## Review")
    found = VERDICT.findall(review)
    return found[-1] if found else "not reviewed"


def index_block(prs):
    """The sheets' index, one table per track, the upstream track first."""
    lines = [INDEX_BEGIN]
    for track in assemble.TRACKS:
        ours = [p for p in prs if p.track == track]
        lines += ["", f"### The {track} track ({len(ours)} PRs)", ""]
        lines += ["| # | sheet | title | depends on | size | review |"]
        lines += ["|---|---|---|---|---|---|"]
        for i, p in enumerate(ours, 1):
            files, added, removed = pr_size(p)
            deps = ", ".join(p.depends) or "nothing"
            lines.append(
                f"| {i} | [{p.name}]({p.name}.md) | {p.title} | {deps} | "
                f"{files} files, +{added} / -{removed} | {review_verdict(p)} |"
            )
    lines.append(INDEX_END)
    return "\n".join(lines)


def write_sheets(prs=None):
    """Refresh the generated block of every PR's sheet (docs/upstream/<pr>.md);
    a missing sheet is started. Returns the sheets written."""
    prs = series() if prs is None else prs
    written = []
    for pr in prs:
        sheet = SHEETS / f"{pr.name}.md"
        block = sheet_block(pr, prs)
        if not sheet.is_file():
            text = f"# PR: {pr.title}\n\n{block}"
        else:
            text = sheet.read_text()
            if SHEET_BEGIN in text:
                i, j = text.index(SHEET_BEGIN), text.index(SHEET_END) + len(SHEET_END)
                text = text[:i] + block.rstrip("\n") + text[j:]
            else:
                head, _, rest = text.partition("\n\n")
                text = f"{head}\n\n{block}\n{rest}"
        if not sheet.is_file() or sheet.read_text() != text:
            sheet.write_text(text)
            written.append(str(sheet.relative_to(ROOT)))
    text = INDEX.read_text()
    if INDEX_BEGIN in text:
        i, j = text.index(INDEX_BEGIN), text.index(INDEX_END) + len(INDEX_END)
        new = text[:i] + index_block(prs) + text[j:]
        if new != text:
            INDEX.write_text(new)
            written.append(str(INDEX.relative_to(ROOT)))
    return written


def test_prs(python=sys.executable, names=None):
    """Each PR alone: export it (with its dependencies) onto the pinned
    release's tree and run its tests there, with ``python`` (whose installed
    mlx_lm the tree's goes in front of). Returns the PRs that failed."""
    failed = []
    prs = series()
    for pr in prs:
        if names and pr.name not in names:
            continue
        start = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "tree"
            shutil.copytree(
                fetch_upstream(), tree, ignore=shutil.ignore_patterns("__pycache__")
            )
            problems = export(tree, pr.name)
            for line in problems:
                print(f"{pr.name}: conflict: {line}")
            code = 1
            if not problems and pr.tests:
                # Only the exported tree: a PR's tests import nothing of the
                # fork's own (benchmarks/, checks/).
                env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")
                env["TOKENIZERS_PARALLELISM"] = "false"
                cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
                cmd += ["--tb=short"]
                for t in pr.tests:
                    cmd += ["--deselect", t[1:]] if t.startswith("-") else [t]
                r = subprocess.run(
                    cmd, cwd=tree, env=env, capture_output=True, text=True
                )
                code = r.returncode
                summary = (r.stdout.strip().splitlines() or [""])[-1]
                if code != 0:
                    print(r.stdout[-6000:] + r.stderr[-2000:])
            else:
                summary = "no tests" if not problems else "does not apply"
        took = time.monotonic() - start
        status = "ok" if code == 0 else "FAILED"
        print(f"PR {pr.name:20} {status:6} {took:6.1f} s  {summary}", flush=True)
        if code != 0:
            failed.append(pr.name)
    return failed


def fetch_mlx_vlm(python=sys.executable):
    """Unpack mlx-vlm's pinned wheel into build/mlx-vlm (once)."""
    target = ROOT / "build" / "mlx-vlm"
    if (target / "mlx_vlm").is_dir():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        _run(
            python, "-m", "pip", "download", "--quiet", "--no-deps", MLX_VLM, "-d", tmp
        )
        (wheel,) = Path(tmp).glob("*.whl")
        digest = assemble._sha256(wheel)
        if digest != MLX_VLM_SHA256:
            raise ForkError(f"{wheel.name}: sha256 {digest}, pinned {MLX_VLM_SHA256}")
        shutil.rmtree(target, ignore_errors=True)
        zipfile.ZipFile(wheel).extractall(target)
    return target


def test(ref=None):
    """The fork's test command: install the fork from git into a fresh venv,
    then run the fork's tests, the release's own suite and the linters."""
    ref = ref or os.environ.get("MLX_LM_FORK_REF")
    if ref is None:
        # A detached checkout (as some CI systems make) has no branch main.
        has_main = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--verify", "--quiet", "main"],
            capture_output=True,
        )
        ref = "main" if has_main.returncode == 0 else "HEAD"
    venv = ROOT / "build" / "venv-test"
    shutil.rmtree(venv, ignore_errors=True)
    _run(sys.executable, "-m", "venv", venv)
    python = _venv_python(venv)
    pip = [python, "-m", "pip", "install", "--quiet"]
    _run(*pip, "--upgrade", "pip")
    # torch for the reference-parity tests; pinned so pip takes the CPU build.
    _run(*pip, "torch==2.13.0")
    extras = "test" if sys.platform == "darwin" else "cpu,test"
    _run(*pip, f"{UPSTREAM_NAME}[{extras}] @ git+file://localhost{ROOT}@{ref}")
    _run(*pip, "pytest", *TEST_CLIENTS, *LINT_REQUIREMENTS)
    fetch_mlx_vlm(python)

    results = {}
    version = subprocess.run(
        [venv / "bin" / "mlx_lm", "--version"], capture_output=True, text=True
    ).stdout.strip()
    scripts = [
        s for s in upstream_project()["scripts"] if not (venv / "bin" / s).exists()
    ]
    results["install from git"] = version == VERSION and not scripts
    print(f"installed {version!r} from {ref}; missing console scripts: {scripts}")

    cmd = [venv / "bin" / "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["tests", "checks", "tools"]
    print("+", " ".join(map(str, cmd)), flush=True)
    code = subprocess.run(cmd, cwd=ROOT).returncode
    if code == 5:
        print("pytest collected no tests")
    results["fork tests"] = code in (0, 5)
    problems = check_series()
    for line in problems:
        print("series:", line)
    results["series complete"] = not problems
    failed = test_prs(python)
    results["each PR alone"] = not failed
    # The fork beside the pristine release on tiny models.
    names = [p.name for p in series()]
    results["differential"] = differential.run(python, UPSTREAM_VERSION, names)
    # In the test venv, which has the test extra for upstream's tests.
    cmd = [python, Path(__file__).resolve(), "upstream-tests"]
    results["upstream suite"] = subprocess.run(list(map(str, cmd))).returncode == 0
    lint_cmd = [python, Path(__file__).resolve(), "lint"]
    results["lint"] = subprocess.run(list(map(str, lint_cmd))).returncode == 0
    print()
    notes = {
        "upstream suite": "every test passes but those that fail or skip the "
        f"same way on the pristine {UPSTREAM_VERSION} (listed above)"
    }
    for name, ok in results.items():
        note = f": {notes[name]}" if ok and name in notes else ""
        print(f"{name:20} {'ok' if ok else 'FAILED'}{note}")
    return all(results.values())


def make_parser():
    parser = argparse.ArgumentParser(
        prog="tools/fork.py", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("stage", help="write the assembled mlx_lm into DEST")
    p.add_argument("dest", help="the folder to write (DEST/mlx_lm)")
    p.add_argument("--link", action="store_true", help="link the fork's files")
    p = sub.add_parser("dev", help="set up or refresh build/dev and .venv")
    p.add_argument("--force", action="store_true", help="drop unsynced edits")
    p = sub.add_parser("diff", help="turn dev-tree edits back into patches/")
    p.add_argument(
        "--pr", help="the PR that takes the edits (where several edit a file)"
    )
    p = sub.add_parser("export", help="apply the fork onto an upstream tree")
    p.add_argument("tree", help="an mlx-lm source tree (with mlx_lm/), edited")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--pr", help="only this PR and the PRs it depends on")
    which.add_argument(
        "--track",
        choices=assemble.TRACKS,
        help="only the PRs of this track and the PRs they depend on",
    )
    p = sub.add_parser("series", help="the PRs, their sizes; check that each applies")
    p.add_argument(
        "--sheets", action="store_true", help="refresh docs/upstream/<pr>.md"
    )
    p.add_argument(
        "--track", choices=assemble.TRACKS, help="list only the PRs of this track"
    )
    p = sub.add_parser("test-prs", help="each PR alone on 0.32.2 with its tests")
    p.add_argument("names", nargs="*", help="PRs (default all)")
    p.add_argument(
        "--track", choices=assemble.TRACKS, help="the PRs of this track only"
    )
    sub.add_parser("lint", help="black, isort, ruff on what the fork touches")
    sub.add_parser(
        "demo",
        help="set up, then a long decode on a tiny model",
        description="Set up .venv, then run benchmarks/long_decode.py: a long "
        "decode on a tiny random model through stream_generate, printing "
        "tokens/s, active memory and the largest cache graph.",
        epilog=DEMO_OPTIONS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p = sub.add_parser(
        "tiny-model",
        help="write a tiny random model folder",
        description="Write a tiny model folder (config, random weights, a "
        "small tokenizer trained here) that mlx_lm's commands load; the text "
        "it generates is noise.",
    )
    p.add_argument("dir", help="the folder to write")
    p.add_argument(
        "--model-type",
        choices=TINY_MODEL_TYPES,
        default="deepseek_v4",
        help="the architecture (default deepseek_v4)",
    )
    p.add_argument(
        "--mtp",
        action="store_true",
        help="DeepSeek-V4's multi-token-prediction block too (mtp.*, "
        "num_nextn_predict_layers 1), for `mlx_lm.generate --mtp`",
    )
    p.add_argument(
        "--dspark",
        action="store_true",
        help="a V4-Flash-0731-shaped DeepSeek-V4 instead: its DSpark drafter "
        "(dspark_* fields, three stages) and the 0731 chat format, for "
        "`mlx_lm.generate --mtp`",
    )
    p = sub.add_parser(
        "differential",
        help="the fork beside pristine 0.32.2 on tiny models",
        description=differential.__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--print",
        action="store_true",
        dest="print_list",
        help="print the differences found as entries of "
        f"{differential.EXPECTED.relative_to(ROOT)} (the entries that match "
        "kept as they are; new ones to be filled in)",
    )
    p.add_argument(
        "--write",
        action="store_true",
        help=f"write that list into {differential.EXPECTED.relative_to(ROOT)}",
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="write both sides' normalised outputs (fork.json, pristine.json) "
        "and the model folders into DIR",
    )

    p = sub.add_parser("test", help="install from git and run every check")
    p.add_argument("--ref", help="git ref to install (default main)")
    sub.add_parser(
        "upstream-tests",
        help="run the release's own test suite",
        epilog="Other arguments go on to pytest (after --).",
    )

    sub.add_parser("upstream-path", help="print the pinned release's tree")
    return parser


def main(argv=None):
    parser = make_parser()
    # demo and upstream-tests pass any other arguments on (to the benchmark
    # script and to pytest).
    args, extra = parser.parse_known_args(argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if extra and args.command not in ("demo", "upstream-tests"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "stage":
            print(stage(args.dest, link=args.link) / "mlx_lm")
        elif args.command == "dev":
            python = setup_dev(force=args.force)
            print(f"dev tree: {DEV_TREE / 'mlx_lm'}\npython:   {python}")
        elif args.command == "diff":
            for line in sync_patches(args.pr) or ["patches/ is up to date"]:
                print(line)
        elif args.command == "export":
            problems = export(args.tree, args.pr, args.track)
            for line in problems:
                print("conflict:", line)
            if problems:
                return 1
            print(f"applied; `git -C {args.tree} diff` shows the change")
        elif args.command == "series":
            print_series(track=args.track)
            if args.sheets:
                for line in write_sheets():
                    print("wrote", line)
            problems = check_series()
            for line in problems:
                print("problem:", line)
            print("series: " + ("FAILED" if problems else "every PR applies alone"))
            return 1 if problems else 0
        elif args.command == "test-prs":
            names = args.names
            if args.track:
                names += [p.name for p in series() if p.track == args.track]
            return 1 if test_prs(names=names) else 0
        elif args.command == "lint":
            return 0 if lint() else 1
        elif args.command == "demo":
            python = setup_dev()
            script = ROOT / "benchmarks" / "long_decode.py"
            return subprocess.run([python, script, *extra]).returncode
        elif args.command == "tiny-model":
            if args.mtp and args.model_type != "deepseek_v4":
                parser.error("--mtp: the MTP block is DeepSeek-V4's")
            if args.dspark and args.model_type != "deepseek_v4":
                parser.error("--dspark: the DSpark drafter is DeepSeek-V4's")
            python = setup_dev()
            # The demo's folder builder.
            code = (
                "import sys; sys.path.insert(0, sys.argv[1]); "
                "from long_decode import make_model_folder; "
                "print(make_model_folder(sys.argv[2], sys.argv[3], "
                "mtp=sys.argv[4] == 'mtp', dspark=sys.argv[4] == 'dspark'))"
            )
            mtp = "dspark" if args.dspark else "mtp" if args.mtp else "-"
            cmd = [python, "-c", code, ROOT / "benchmarks", args.dir, args.model_type]
            return subprocess.run(list(map(str, cmd + [mtp]))).returncode
        elif args.command == "differential":
            python = setup_dev()
            names = [p.name for p in series()]
            ok = differential.run(
                python,
                UPSTREAM_VERSION,
                names,
                keep=args.keep,
                print_list=args.print_list,
                write_list=args.write,
            )
            return 0 if ok else 1
        elif args.command == "test":
            return 0 if test(args.ref) else 1
        elif args.command == "upstream-tests":
            return 0 if upstream_tests(pytest_args=extra) else 1
        elif args.command == "upstream-path":
            print(fetch_upstream())
    except ForkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
