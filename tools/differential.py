# Copyright © 2026 Apple Inc.
"""The fork beside pristine mlx-lm 0.32.2: the same CLIs, server requests and
Python API calls on the same tiny random models, outputs compared.

tools/differential_probe.py runs once under the fork's Python and once under
a venv of the pinned release from the package index (build/venv-pristine,
kept between runs), on tiny Llama, Qwen3 and Qwen3.5 folders that
benchmarks/long_decode.py builds (as ``tools/fork.py tiny-model`` does).
Every output that differs must match an entry of
tools/differential-expected.toml, which names the PR that makes the
difference and why a client is better served by it; every entry must match
a difference. ``tools/fork.py differential --write`` writes the list as the
current differences make it (``--print`` prints it).
"""

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
PROBE = TOOLS / "differential_probe.py"
EXPECTED = TOOLS / "differential-expected.toml"
PRISTINE_VENV = ROOT / "build" / "venv-pristine"
MODELS = ("llama", "qwen3", "qwen3_5")
# Entries still to be written by hand.
TODO = "TODO"


# ----------------------------------------------------------------------------
# The two sides


def pristine_python(version, venv=PRISTINE_VENV):
    """The Python of a venv with mlx-lm ``version`` from the package index;
    made once, kept under build/."""
    python = Path(venv) / "bin" / "python"
    check = [python, "-c", "import mlx_lm; print(mlx_lm.__version__)"]
    if python.exists():
        r = subprocess.run(check, capture_output=True, text=True)
        if r.stdout.strip() == version:
            return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    extra = "" if sys.platform == "darwin" else "[cpu]"
    pip = [python, "-m", "pip", "install", "--quiet", f"mlx-lm{extra}=={version}"]
    print("+", " ".join(map(str, pip)), flush=True)
    subprocess.run(pip, check=True)
    r = subprocess.run(check, capture_output=True, text=True, check=True)
    if r.stdout.strip() != version:
        raise RuntimeError(f"{venv} has mlx-lm {r.stdout.strip()}, not {version}")
    return python


def make_models(python, top, models=MODELS):
    """The tiny model folders, built once with ``python`` (the fork's)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from long_decode import make_model_folder\n"
        "for name in sys.argv[3:]: make_model_folder(f'{sys.argv[2]}/{name}', name)"
    )
    Path(top).mkdir(parents=True, exist_ok=True)
    cmd = [python, "-c", code, ROOT / "benchmarks", top, *models]
    subprocess.run(list(map(str, cmd)), check=True, env=_env(), cwd=top)
    return {name: str(Path(top) / name) for name in models}


def _env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    return env


def probe(python, models, work, out):
    cmd = [python, PROBE, "--work", work, "--out", out]
    for name, path in models.items():
        cmd += ["--model", f"{name}={path}"]
    Path(work).mkdir(parents=True, exist_ok=True)
    log = Path(work).parent / (Path(work).name + ".log")
    with open(log, "w") as f:
        code = subprocess.run(
            list(map(str, cmd)), cwd=work, env=_env(), stdout=f, stderr=f
        ).returncode
    if code != 0:
        raise RuntimeError(
            f"the probe under {python} failed ({code}):\n" + log.read_text()[-4000:]
        )
    return json.loads(Path(out).read_text())


def run_sides(fork_python, version, top, models=MODELS):
    """Both sides' outputs: (fork, pristine, seconds each)."""
    pristine = pristine_python(version)
    for name in ("models", "fork", "pristine"):
        shutil.rmtree(Path(top) / name, ignore_errors=True)
    folders = make_models(fork_python, Path(top) / "models", models)
    times = {}

    def side(name, python):
        tic = time.monotonic()
        out = probe(python, folders, Path(top) / name, Path(top) / f"{name}.json")
        times[name] = time.monotonic() - tic
        return out

    with ThreadPoolExecutor(2) as pool:
        fork = pool.submit(side, "fork", fork_python)
        upstream = pool.submit(side, "pristine", pristine)
        return fork.result(), upstream.result(), times


# ----------------------------------------------------------------------------
# Differences


def flatten(obj, prefix=""):
    """{path: leaf} of a JSON value; paths join keys and list indices by /.
    An empty list or dict is a leaf of its own."""
    if isinstance(obj, dict) and obj:
        out = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}/{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list) and obj:
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}/{i}"))
        return out
    return {prefix: obj}


MISSING = "<missing>"


def differences(fork, pristine):
    """{path: (fork's value, pristine's)} of every leaf that differs; the
    environment (versions) is not compared."""
    a = flatten({k: v for k, v in fork.items() if k != "env"})
    b = flatten({k: v for k, v in pristine.items() if k != "env"})
    return {
        p: (a.get(p, MISSING), b.get(p, MISSING))
        for p in sorted(set(a) | set(b))
        if a.get(p, MISSING) != b.get(p, MISSING)
    }


def load_expected(path=EXPECTED):
    with open(path, "rb") as f:
        return tomllib.load(f).get("difference", [])


def check_entries(entries, pr_names):
    """Problems with the entries themselves: fields, PR names."""
    problems = []
    for i, e in enumerate(entries):
        label = f"entry {i + 1} ({e.get('what', '?')!r})"
        for field in ("what", "pr", "why", "paths"):
            if not e.get(field) or e.get(field) == TODO:
                problems.append(f"{label}: no {field!r}")
        if e.get("pr") and e["pr"] != TODO and e["pr"] not in pr_names:
            problems.append(f"{label}: {e['pr']!r} is no PR of patches/series.toml")
    return problems


def covers(pattern, path):
    """Whether ``pattern`` (fnmatch) names ``path`` or a part above it."""
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(
        path, pattern + "/*"
    )


def match(diffs, entries):
    """(unexpected paths, stale patterns as (entry index, pattern), the
    entry index each expected path matched)."""
    owner = {}
    used = set()
    for path in diffs:
        for i, e in enumerate(entries):
            hit = next((p for p in e.get("paths", []) if covers(p, path)), None)
            if hit is not None:
                owner[path] = i
                used.add((i, hit))
                break
    unexpected = [p for p in diffs if p not in owner]
    stale = [
        (i, p)
        for i, e in enumerate(entries)
        for p in e.get("paths", [])
        if (i, p) not in used
    ]
    return unexpected, stale, owner


def _short(value, n=160):
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= n else text[: n - 3] + "..."


def report(diffs, entries, pr_names):
    """The check's verdict as lines, and whether it passed."""
    unexpected, stale, owner = match(diffs, entries)
    problems = check_entries(entries, pr_names)
    lines = []
    counts = {}
    for i in owner.values():
        counts[i] = counts.get(i, 0) + 1
    for i, e in enumerate(entries):
        n = counts.get(i, 0)
        lines.append(f"expected ({e.get('pr')}): {e.get('what')}: {n} outputs")
    cases = {}
    for p in unexpected:
        cases.setdefault("/".join(p.split("/")[:3]), []).append(p)
    for case, paths in cases.items():
        lines.append(f"UNEXPECTED: {case} ({len(paths)} outputs differ)")
        for p in paths[:3]:
            fork, pristine = diffs[p]
            lines.append(f"  {p}\n    fork:     {_short(fork)}")
            lines.append(f"    pristine: {_short(pristine)}")
    for i, p in stale:
        lines.append(
            f"STALE: entry {i + 1} ({entries[i].get('what')!r}): {p} matches no "
            "difference (the fork gives what 0.32.2 gives there now: take it out)"
        )
    lines += [f"BAD ENTRY: {p}" for p in problems]
    ok = not unexpected and not stale and not problems
    return lines, ok


# ----------------------------------------------------------------------------
# The list, written from the differences


def _toml_str(s):
    return json.dumps(s, ensure_ascii=False)


def group_new(paths, models=MODELS):
    """Patterns for differences no entry matches: one per case (the first
    three parts of a path, its model as * where every model differs there)."""
    cases = {}
    for p in paths:
        parts = p.split("/")
        area, model, case = (parts + ["", "", ""])[:3]
        cases.setdefault((area, case), set()).add(model)
    patterns = []
    for (area, case), names in sorted(cases.items()):
        if set(models) <= names:
            patterns.append(f"{area}/*/{case}" if case else f"{area}/*")
        else:
            patterns += [f"{area}/{m}/{case}" for m in sorted(names)]
    return patterns


def list_text(diffs, entries):
    """The text of the expected-differences file for ``diffs``: the entries
    that match something, with their patterns that match something, then an
    entry to fill in for what none matches."""
    unexpected, stale, _ = match(diffs, entries)
    stale = set(stale)
    out = [
        "# Differences between the fork and pristine mlx-lm 0.32.2 that the",
        "# differential check (tools/differential.py) expects. Each: what",
        "# differs, the PR of patches/series.toml that makes it, why a client",
        "# is better served, and the outputs: fnmatch patterns over",
        "# <area>/<model>/<case>/<json path>, each naming the outputs it",
        "# matches and those below them (`python3 tools/fork.py differential",
        "# --keep DIR` writes both sides' outputs as DIR/fork.json and",
        "# DIR/pristine.json).",
        "# `python3 tools/fork.py differential --write` writes it from the",
        "# differences found (the entries that match kept, one to fill in",
        "# for the rest); `--print` prints it.",
        "",
    ]
    for i, e in enumerate(entries):
        paths = [p for p in e.get("paths", []) if (i, p) not in stale]
        if paths:
            out += _entry(e, paths)
    if unexpected:
        new = {"what": TODO, "pr": TODO, "why": TODO}
        out += _entry(new, group_new(unexpected))
    return "\n".join(out).rstrip("\n") + "\n"


def _entry(e, paths):
    lines = ["[[difference]]"]
    for field in ("what", "pr", "why"):
        lines.append(f"{field} = {_toml_str(e.get(field, TODO))}")
    lines.append("paths = [")
    lines += [f"    {_toml_str(p)}," for p in paths]
    lines += ["]", ""]
    return lines


# ----------------------------------------------------------------------------


def run(fork_python, version, pr_names, keep=None, print_list=False, write_list=False):
    """The check; returns whether it passed. ``print_list``: print the list
    the differences make instead of the verdict; ``write_list``: write it
    into EXPECTED."""
    tic = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(keep) if keep else Path(tmp)
        top.mkdir(parents=True, exist_ok=True)
        fork, pristine, times = run_sides(fork_python, version, top)
    diffs = differences(fork, pristine)
    entries = load_expected()
    if print_list or write_list:
        text = list_text(diffs, entries)
        if write_list:
            EXPECTED.write_text(text)
            print(f"wrote {EXPECTED}; fill in the entries marked {TODO}")
        else:
            print(text, end="")
        return True
    lines, ok = report(diffs, entries, pr_names)
    for line in lines:
        print(line)
    if fork["env"] != pristine["env"]:
        print(f"note: the sides differ in {fork['env']} / {pristine['env']}")
    took = time.monotonic() - tic
    sides = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    print(
        f"differential: {len(diffs)} outputs differ, "
        f"{'as expected' if ok else 'FAILED'} ({took:.0f} s; {sides})"
    )
    if not ok:
        print(
            "  `python3 tools/fork.py differential --write` makes the list "
            "of expected differences what the fork gives now (then fill in "
            f"the entries marked {TODO})"
        )
    return ok
