# Copyright © 2026 Apple Inc.
"""Assemble this fork of mlx-lm from the pinned release, its files and patches.

The pinned release (an sdist fetched by package name and checked against a
pinned sha256) gives the base tree, the package metadata and upstream's test
suite. The fork adds the files under ``mlx_lm/`` and ``tests/`` of this
repository, and edits upstream files through one unified diff per file under
``patches/``: ``patches/mlx_lm/`` for the package, ``patches/tests/`` for
upstream's test suite.

Commands (``python tools/fork.py <command> --help`` for details):

  demo     set up the dev venv and run a long decode on a tiny model
  tiny-model  write a tiny random model folder that mlx_lm's commands load
  stage    write the assembled ``mlx_lm`` package into a folder
  dev      set up (or refresh) the development tree and venv
  diff     turn edits of upstream files in the dev tree back into patches/
  export   apply the fork onto an upstream mlx-lm source tree
  lint     black, isort and ruff on every file the fork adds or changes
  test     install from git into a fresh venv and run every check
  upstream-tests  run the pinned release's own test suite against mlx_lm
"""

import argparse
import difflib
import hashlib
import logging
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
DEV_TREE = ROOT / "build" / "dev"
DEV_VENV = ROOT / ".venv"
CACHE = Path(
    os.environ.get("MLX_LM_FORK_CACHE", Path.home() / ".cache" / "mlx-lm-fork")
)

# The pinned release's own suite on Linux, mlx[cpu], offline (see
# tools/upstream-not-passing.txt).
PRISTINE_SUITE = "242 passed, 16 skipped, 27 failed, 85 errors"

# Linters pinned as in upstream's pre-commit configuration.
LINT_REQUIREMENTS = ["black==25.1.0", "isort==6.0.1", "ruff==0.17.6"]
# What the server tests drive mlx_lm.server with and measure it by.
TEST_CLIENTS = ["openai", "psutil"]


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


def patch_files(part=None):
    """Patch files: all, or those of ``mlx_lm`` or ``tests``."""
    return sorted((PATCHES / part if part else PATCHES).rglob("*.patch"))


def _patch_path(rel):
    return PATCHES / (str(rel) + ".patch")


def _target_of(patch):
    return patch.relative_to(PATCHES).with_suffix("")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage().strip())


def apply_patch(patch, root):
    """Apply one patch file onto the tree ``root`` with patch-ng.

    Returns a list of problems (empty on success), each naming the patch file
    and the hunk that does not apply.
    """
    import patch_ng

    target = Path(root) / _target_of(patch)
    logger = logging.getLogger("patch_ng")
    handler = _Collect()
    logger.addHandler(handler)
    try:
        pset = patch_ng.fromfile(str(patch))
        if not pset:
            return [f"{patch}: not a unified diff"]
        if not target.is_file():
            return [f"{patch}: {_target_of(patch)} does not exist in {root}"]
        ok = pset.apply(strip=1, root=str(root))
    finally:
        logger.removeHandler(handler)
    if ok:
        return []
    hunks = [m for m in handler.messages if "hunk" in m]
    return [f"{patch}: {m}" for m in (hunks or handler.messages)] or [
        f"{patch}: does not apply"
    ]


def make_patch(rel, old, new):
    """A unified diff of one file, in the form ``apply_patch`` reads."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{rel}",
        tofile=f"b/{rel}",
    )
    return "".join(lines)


def stage(dest, link=False):
    """Write the assembled package to ``dest/mlx_lm``, upstream's test suite
    with ``patches/tests/`` applied to ``dest/tests``, and return ``dest``.

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
    for rel in fork_files():
        if (upstream / rel).exists():
            raise ForkError(
                f"{rel} is a file of upstream mlx-lm {UPSTREAM_VERSION}: "
                f"edit it through {_patch_path(rel).relative_to(ROOT)}"
            )
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if link:
            out.symlink_to(ROOT / rel)
        else:
            shutil.copyfile(ROOT / rel, out)
    problems = []
    for patch in patch_files("mlx_lm"):
        problems += apply_patch(patch, dest)
    if problems:
        raise ForkError("patches do not apply:\n  " + "\n  ".join(problems))
    (dest / "mlx_lm" / "_version.py").write_text(f"__version__ = {VERSION!r}\n")
    stage_tests(dest)
    return dest


def stage_tests(dest):
    """Write upstream's test suite, with ``patches/tests/`` applied, to
    ``dest/tests`` and return that folder."""
    tests = Path(dest) / "tests"
    shutil.rmtree(tests, ignore_errors=True)
    shutil.copytree(
        fetch_upstream() / "tests", tests, ignore=shutil.ignore_patterns("__pycache__")
    )
    problems = []
    for patch in patch_files("tests"):
        problems += apply_patch(patch, dest)
    if problems:
        raise ForkError("patches do not apply:\n  " + "\n  ".join(problems))
    return tests


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
    """Upstream files edited in the dev tree whose patch is not up to date."""
    upstream = fetch_upstream()
    pending = []
    for rel in _dev_files():
        path = DEV_TREE / rel
        if path.is_symlink() or not (upstream / rel).is_file():
            if not path.is_symlink() and rel.name != "_version.py":
                pending.append(rel)
            continue
        if rel.name == "_version.py":
            continue
        old, new = (upstream / rel).read_text(), path.read_text()
        patch = _patch_path(rel)
        want = make_patch(rel, old, new) if old != new else ""
        have = patch.read_text() if patch.is_file() else ""
        if want != have:
            pending.append(rel)
    return pending


def sync_patches():
    """Write edits of the dev tree back: patches for upstream files, and new
    files moved into the repository (replaced by a link). Returns what
    changed."""
    upstream = fetch_upstream()
    changed = []
    for rel in _dev_files():
        path = DEV_TREE / rel
        if path.is_symlink() or rel.name == "_version.py":
            continue
        if not (upstream / rel).is_file():
            (ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, ROOT / rel)
            path.symlink_to(ROOT / rel)
            changed.append(f"new file {rel}")
            continue
        old, new = (upstream / rel).read_text(), path.read_text()
        patch = _patch_path(rel)
        have = patch.read_text() if patch.is_file() else ""
        want = make_patch(rel, old, new) if old != new else ""
        if want == have:
            continue
        if want:
            patch.parent.mkdir(parents=True, exist_ok=True)
            patch.write_text(want)
            changed.append(f"wrote {patch.relative_to(ROOT)}")
        else:
            patch.unlink()
            changed.append(f"removed {patch.relative_to(ROOT)}")
    return changed


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
    reqs += ["patch-ng==1.19.1", "pytest", *TEST_CLIENTS, *LINT_REQUIREMENTS]
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


def _reexec_with_patch_ng():
    """Run this command again in the dev venv if patch-ng is missing here."""
    try:
        import patch_ng  # noqa: F401
    except ImportError:
        python = _venv_python(DEV_VENV)
        if not python.exists():
            _make_venv(DEV_VENV)
        os.execv(python, [str(python), __file__, *sys.argv[1:]])


# ----------------------------------------------------------------------------
# Export onto an upstream tree


def export(tree):
    """Copy the fork's files into an upstream source tree and apply the
    patches there. Returns the conflicts, one per file and hunk."""
    tree = Path(tree)
    if not (tree / "mlx_lm" / "__init__.py").is_file():
        raise ForkError(f"{tree} is not an mlx-lm source tree (no mlx_lm/)")
    problems = []
    new = fork_files() + [Path("tests") / p for p in _files(ROOT / "tests")]
    for rel in new:
        out = tree / rel
        if out.exists():
            problems.append(f"{rel}: exists in {tree}; not overwritten")
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, out)
    for patch in patch_files():
        problems += apply_patch(patch, tree)
    return problems


# ----------------------------------------------------------------------------
# Checks


def lint_files(tree):
    """Paths in ``tree`` of every Python file the fork adds or changes."""
    files = [p for p in fork_files() if p.suffix == ".py"]
    files += [_target_of(p) for p in patch_files() if p.name.endswith(".py.patch")]
    files = [Path(tree) / p for p in sorted(files)]
    files += sorted((ROOT / "tests").rglob("*.py"))
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
        upstream_tests = [f for f in files if f.startswith(str(tree / "tests"))]
        failed = False
        for cmd, paths in (
            (["-m", "black", "--check"], files),
            (isort, [f for f in files if f not in upstream_tests]),
            (isort + ["-p", "mlx_lm"], upstream_tests),
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
    # git+file URLs with a ref need a recent pip.
    _run(*pip, "--upgrade", "pip")
    # torch for the reference-parity tests; pinned so pip takes the CPU build.
    _run(*pip, "torch==2.13.0")
    extras = "test" if sys.platform == "darwin" else "cpu,test"
    _run(*pip, f"{UPSTREAM_NAME}[{extras}] @ git+file://{ROOT}@{ref}")
    _run(*pip, "pytest", "patch-ng==1.19.1", *TEST_CLIENTS, *LINT_REQUIREMENTS)

    results = {}
    version = subprocess.run(
        [venv / "bin" / "mlx_lm", "--version"], capture_output=True, text=True
    ).stdout.strip()
    scripts = [
        s for s in upstream_project()["scripts"] if not (venv / "bin" / s).exists()
    ]
    results["install from git"] = version == VERSION and not scripts
    print(f"installed {version!r} from {ref}; missing console scripts: {scripts}")

    cmd = [venv / "bin" / "pytest", "-q", "-p", "no:cacheprovider", "tests", "tools"]
    print("+", " ".join(map(str, cmd)), flush=True)
    code = subprocess.run(cmd, cwd=ROOT).returncode
    if code == 5:
        print("pytest collected no tests")
    results["fork tests"] = code in (0, 5)
    # In the test venv, which has patch-ng for the patched upstream tests.
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


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="tools/fork.py", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("stage", help="write the assembled mlx_lm into DEST")
    p.add_argument("dest")
    p.add_argument("--link", action="store_true", help="link the fork's files")
    p = sub.add_parser("dev", help="set up or refresh build/dev and .venv")
    p.add_argument("--force", action="store_true", help="drop unsynced edits")
    sub.add_parser("diff", help="turn dev-tree edits back into patches/")
    p = sub.add_parser("export", help="apply the fork onto an upstream tree")
    p.add_argument("tree")
    sub.add_parser("lint", help="black, isort, ruff on what the fork touches")
    sub.add_parser("demo", help="set up, then a long decode on a tiny model")
    p = sub.add_parser("tiny-model", help="write a tiny random model folder")
    p.add_argument("dir")
    p.add_argument(
        "--model-type", choices=("deepseek_v4", "qwen3_5"), default="deepseek_v4"
    )

    p = sub.add_parser("test", help="install from git and run every check")
    p.add_argument("--ref", help="git ref to install (default main)")
    sub.add_parser("upstream-tests", help="run the release's own test suite")

    sub.add_parser("upstream-path", help="print the pinned release's tree")
    # demo and upstream-tests pass any other arguments on (to the benchmark
    # script and to pytest).
    args, extra = parser.parse_known_args(argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if extra and args.command not in ("demo", "upstream-tests"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command in (
        "stage",
        "dev",
        "demo",
        "tiny-model",
        "export",
        "lint",
        "upstream-tests",
    ):
        _reexec_with_patch_ng()

    try:
        if args.command == "stage":
            print(stage(args.dest, link=args.link) / "mlx_lm")
        elif args.command == "dev":
            python = setup_dev(force=args.force)
            print(f"dev tree: {DEV_TREE / 'mlx_lm'}\npython:   {python}")
        elif args.command == "diff":
            for line in sync_patches() or ["patches/ is up to date"]:
                print(line)
        elif args.command == "export":
            problems = export(args.tree)
            for line in problems:
                print("conflict:", line)
            if problems:
                return 1
            print(f"applied; `git -C {args.tree} diff` shows the change")
        elif args.command == "lint":
            return 0 if lint() else 1
        elif args.command == "demo":
            python = setup_dev()
            script = ROOT / "benchmarks" / "long_decode.py"
            return subprocess.run([python, script, *extra]).returncode
        elif args.command == "tiny-model":
            python = setup_dev()
            # The demo's folder builder.
            code = (
                "import sys; sys.path.insert(0, sys.argv[1]); "
                "from long_decode import make_model_folder; "
                "print(make_model_folder(sys.argv[2], sys.argv[3]))"
            )
            cmd = [python, "-c", code, ROOT / "benchmarks", args.dir, args.model_type]
            return subprocess.run(list(map(str, cmd))).returncode
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
