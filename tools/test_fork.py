# Copyright © 2026 Apple Inc.

import contextlib
import io
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fork  # noqa: E402


class TestForkAssembly(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.upstream = fork.fetch_upstream()

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp)

    def sandbox(self):
        """A copy of this repository's fork files, used as the fork's root."""
        root = self.tmp / "repo"
        for name in ("mlx_lm", "patches", "tests"):
            if (fork.ROOT / name).is_dir():
                shutil.copytree(fork.ROOT / name, root / name)
            else:
                (root / name).mkdir(parents=True)
        (root / "tools").mkdir()
        stack = contextlib.ExitStack()
        stack.enter_context(
            mock.patch.multiple(fork.assemble, ROOT=root, PATCHES=root / "patches")
        )
        stack.enter_context(
            mock.patch.multiple(fork, ROOT=root, DEV_TREE=root / "build" / "dev")
        )
        return stack

    def staged_with(self, prs):
        return fork.stage(self.tmp / "staged", prs=fork.closure(fork.series(), prs))

    def test_metadata_comes_from_the_release(self):
        project = fork.upstream_project()
        self.assertEqual(project["name"], "mlx-lm")
        self.assertEqual(len(project["scripts"]), 18)
        self.assertEqual(
            set(project["optional-dependencies"]),
            {"cpu", "cuda12", "cuda13", "test", "train", "evaluate", "vision"},
        )
        self.assertTrue(fork.VERSION.startswith(fork.UPSTREAM_VERSION + "+"))

    def test_stage_is_reproducible(self):
        a = fork.stage(self.tmp / "a")
        b = fork.stage(self.tmp / "b")
        files = fork._files(a / "mlx_lm")
        self.assertEqual(files, fork._files(b / "mlx_lm"))
        for rel in files:
            self.assertEqual(
                (a / "mlx_lm" / rel).read_bytes(),
                (b / "mlx_lm" / rel).read_bytes(),
                rel,
            )
        version = (a / "mlx_lm" / "_version.py").read_text()
        self.assertIn(fork.VERSION, version)

    def test_patches_round_trip(self):
        # Each PR's patch is the diff from the release with its dependencies
        # applied to that tree with the PR applied too.
        prs = fork.series()
        for pr in prs:
            deps = [p for p in fork.closure(prs, [pr.name]) if p is not pr]
            for patch in pr.patches():
                rel = fork.target_of(patch)
                base = fork._apply_all(fork.assemble.base_text(rel), rel, deps)
                new = fork._apply_all(base, rel, [pr])
                text = patch.read_text()
                made = [fork.make_patch(rel, base, new, n) for n in (3, 2, 1, 0)]
                self.assertIn(text, made, patch)

    def test_every_hunk_and_new_file_is_in_exactly_one_pr(self):
        self.assertEqual(fork.check_series(), [])
        prs = fork.series()
        owned = [f for p in prs for f in p.files]
        self.assertEqual(len(owned), len(set(owned)))
        new = fork.fork_files() + [
            Path("tests") / f for f in fork._files(fork.ROOT / "tests")
        ]
        self.assertEqual(sorted(owned), sorted(new))
        # A patch file is one PR's: its folder.
        for patch in fork.assemble.PATCHES.rglob("*.patch"):
            name = patch.relative_to(fork.assemble.PATCHES).parts[0]
            self.assertIn(name, [p.name for p in prs], patch)
        # The series applied in order gives each file; a hunk of one PR
        # taken out breaks the round trip (each hunk counted once).
        staged = fork.stage(self.tmp / "all")
        for rel in {fork.target_of(p) for p in fork.patch_files()}:
            self.assertEqual(fork.series_text(rel, prs), (staged / rel).read_text())

    def test_manifest_names_what_is_missing(self):
        with self.sandbox():
            (fork.ROOT / "tests" / "test_stray.py").write_text("x = 1\n")
            (fork.ROOT / "mlx_lm" / "stray.py").write_text("x = 1\n")
            problems = fork.check_series()
            self.assertTrue(any("test_stray.py is in 0 PRs" in p for p in problems))
            with self.assertRaisesRegex(fork.ForkError, "mlx_lm/stray.py"):
                fork.stage(self.tmp / "out")

    def test_export_of_one_pr_brings_its_dependencies_only(self):
        tree = self.tmp / "upstream"
        shutil.copytree(self.upstream, tree)
        self.assertEqual(fork.export(tree, "server-models"), [])
        prs = fork.closure(fork.series(), ["server-models"])
        self.assertEqual([p.name for p in prs], ["server-requests", "server-models"])
        staged = self.staged_with(["server-models"])
        server = "mlx_lm/server.py"
        self.assertEqual((tree / server).read_text(), (staged / server).read_text())
        text = (tree / server).read_text()
        self.assertIn("def validate_request_fields", text)  # server-requests
        self.assertIn("repos = scan_cache_dir().repos", text)  # server-models
        self.assertNotIn("def _client_disconnected", text)  # server-disconnect
        self.assertNotIn("def fix_mmap_threshold", text)  # server-memory
        self.assertTrue((tree / "tests/test_server_models.py").is_file())
        self.assertFalse((tree / "tests/test_server_disconnect.py").exists())
        self.assertFalse((tree / "tests/test_load_errors.py").exists())
        # The PR alone, without its dependencies, is not what export writes.
        self.assertNotEqual(
            fork.series_text(server, fork.closure(fork.series(), ["server-requests"])),
            text,
        )

    def test_export_of_the_upstream_track_writes_that_track_alone(self):
        tree = self.tmp / "upstream"
        shutil.copytree(self.upstream, tree)
        self.assertEqual(fork.export(tree, track="upstream"), [])
        prs = fork.series()
        ours = fork.assemble.track(prs, "upstream")
        # The track needs nothing of the fork's.
        self.assertEqual({p.track for p in ours}, {"upstream"})
        for pr in prs:
            for rel in pr.files:
                self.assertEqual((tree / rel).is_file(), pr in ours, rel)
        for rel in {fork.target_of(p) for p in fork.patch_files(prs=ours)}:
            self.assertEqual((tree / rel).read_text(), fork.series_text(rel, ours))

    def test_series_lists_one_track(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            fork.print_series(track="fork")
        rows = out.getvalue().splitlines()[1:-1]
        fork_prs = [p.name for p in fork.series() if p.track == "fork"]
        self.assertEqual([r.split()[1] for r in rows], fork_prs)
        self.assertIn(f"{len(fork_prs)} PRs", out.getvalue().splitlines()[-1])

    def test_an_upstream_pr_that_leans_on_the_fork_track_is_a_problem(self):
        def pr(name, track, depends=(), files=()):
            entry = dict(name=name, track=track, depends=list(depends))
            return fork.assemble.PR(dict(entry, title=name, files=list(files)), 0)

        prs = [pr("base", "fork"), pr("model", "upstream", ["base"])]
        self.assertEqual(
            fork.check_tracks(prs),
            ["model: an upstream-track PR depends on base, of the fork track"],
        )
        prs[0].track = "upstream"
        self.assertEqual(fork.check_tracks(prs), [])
        with self.sandbox():
            toml = fork.assemble.PATCHES / "series.toml"
            toml.write_text(
                toml.read_text().replace('track = "fork"', 'track = "f"', 1)
            )
            with self.assertRaisesRegex(fork.ForkError, "track 'f'"):
                fork.series()

    def test_export_of_an_unknown_pr_names_the_prs(self):
        tree = self.tmp / "upstream"
        shutil.copytree(self.upstream, tree)
        with self.assertRaisesRegex(fork.ForkError, "prompt-trie"):
            fork.export(tree, "no-such-pr")

    def test_edit_of_a_file_of_several_prs_needs_a_pr(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            rel = Path("mlx_lm/server.py")
            edited = fork.DEV_TREE / rel
            text = edited.read_text().replace(
                "            repos = []\n",
                "            repos = []  # an edit in the dev tree\n",
            )
            edited.write_text(text)
            self.assertEqual(fork._pending_edits(), [rel])
            with self.assertRaises(fork.ForkError) as e:
                fork.sync_patches()
            for name in ("server-requests", "server-models", "server-memory"):
                self.assertIn(name, str(e.exception))
            self.assertIn("--pr", str(e.exception))

            before = {p: p.read_text() for p in fork.assemble.PATCHES.rglob("*.patch")}
            self.assertEqual(
                fork.sync_patches("server-models"),
                ["wrote patches/server-models/mlx_lm/server.py.patch"],
            )
            self.assertEqual(fork._pending_edits(), [])
            after = {p: p.read_text() for p in fork.assemble.PATCHES.rglob("*.patch")}
            self.assertEqual(
                [p.parent.parent.name for p in after if after[p] != before[p]],
                ["server-models"],
            )
            self.assertIn(
                "an edit in the dev tree",
                after[fork.assemble.patch_path("server-models", rel)],
            )
            # The series gives the edited file; each PR still applies alone.
            self.assertEqual(fork.series_text(rel), text)
            self.assertEqual(fork.check_series(), [])
            tree = self.tmp / "upstream"
            shutil.copytree(self.upstream, tree)
            self.assertEqual(fork.export(tree, "server-memory"), [])
            self.assertNotIn("an edit in the dev tree", (tree / rel).read_text())

    def test_edit_that_shifts_lines_rebases_the_prs_after_it(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            rel = Path("mlx_lm/server.py")
            edited = fork.DEV_TREE / rel
            marker = "class RequestError(ValueError):\n"
            text = edited.read_text().replace(
                marker, "# one\n# two\n# three\n\n\n" + marker
            )
            edited.write_text(text)
            written = fork.sync_patches("server-requests")
            self.assertIn(
                "wrote patches/server-requests/mlx_lm/server.py.patch", written
            )
            self.assertEqual(fork.series_text(rel), text)
            self.assertEqual(fork.check_series(), [])

    def test_edit_in_the_context_of_a_later_pr_updates_that_pr_too(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            rel = Path("mlx_lm/server.py")
            edited = fork.DEV_TREE / rel
            # A line of server-requests that server-disconnect's hunk shows
            # (and server-openai-errors', the last one in the file).
            line = 'logging.exception(f"Generation failed: {e}")'
            later = fork.assemble.patch_path("server-disconnect", rel).read_text()
            self.assertIn(line, later)
            head, _, tail = edited.read_text().rpartition(line)
            text = head + line.replace("Gen", "gen") + tail
            edited.write_text(text)
            self.assertEqual(
                sorted(fork.sync_patches("server-requests")),
                [
                    "wrote patches/server-disconnect/mlx_lm/server.py.patch",
                    "wrote patches/server-openai-errors/mlx_lm/server.py.patch",
                    "wrote patches/server-requests/mlx_lm/server.py.patch",
                ],
            )
            self.assertEqual(fork.series_text(rel), text)
            self.assertEqual(fork.check_series(), [])

    def test_edit_of_a_file_no_pr_edits_needs_a_pr(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            rel = Path("mlx_lm/perplexity.py")
            edited = fork.DEV_TREE / rel
            edited.write_text(edited.read_text() + "\n# an edit\n")
            with self.assertRaisesRegex(fork.ForkError, "no PR edits it yet"):
                fork.sync_patches()
            self.assertEqual(
                fork.sync_patches("prompt-trie"),
                ["wrote patches/prompt-trie/mlx_lm/perplexity.py.patch"],
            )

    def test_dev_tree_edit_becomes_a_patch_and_back(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            rel = Path("mlx_lm/models/base.py")
            edited = fork.DEV_TREE / rel
            text = edited.read_text() + "\n# an edit in the dev tree\n"
            edited.write_text(text)
            self.assertEqual(fork._pending_edits(), [rel])

            self.assertEqual(
                fork.sync_patches(),
                ["wrote patches/config-checks/mlx_lm/models/base.py.patch"],
            )
            self.assertEqual(fork._pending_edits(), [])
            self.assertEqual(fork.sync_patches(), [])

            # The patch alone rebuilds the edit.
            staged = fork.stage(self.tmp / "again")
            self.assertEqual((staged / rel).read_text(), text)

            # A new file written in the dev tree moves into the repository.
            (fork.DEV_TREE / "mlx_lm" / "models" / "brand_new.py").write_text("x = 1\n")
            with self.assertRaisesRegex(fork.ForkError, "--pr"):
                fork.sync_patches()
            self.assertEqual(
                fork.sync_patches("deepseek-v4")[0],
                "new file mlx_lm/models/brand_new.py (PR deepseek-v4)",
            )
            self.assertTrue((fork.ROOT / "mlx_lm/models/brand_new.py").is_file())
            deepseek = fork.closure(fork.series(), ["deepseek-v4"])[-1]
            self.assertIn(Path("mlx_lm/models/brand_new.py"), deepseek.files)

            # Undoing the edit removes the patch.
            edited.write_text((self.upstream / rel).read_text())
            self.assertEqual(
                fork.sync_patches(),
                ["removed patches/config-checks/mlx_lm/models/base.py.patch"],
            )

    def test_edit_of_an_upstream_test_becomes_a_tests_patch(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            rel = Path("tests/test_models.py")
            edited = fork.DEV_TREE / rel
            text = edited.read_text() + "\n# an edit in the dev tree\n"
            edited.write_text(text)
            self.assertEqual(fork._pending_edits(), [rel])
            # Several PRs edit it: the edit names its PR.
            self.assertEqual(
                fork.sync_patches("deepseek-v4"),
                ["wrote patches/deepseek-v4/tests/test_models.py.patch"],
            )
            # The upstream suite runs the patched file; export applies it.
            tests = fork.stage_tests(self.tmp / "suite")
            self.assertEqual((tests / "test_models.py").read_text(), text)
            tree = self.tmp / "upstream"
            shutil.copytree(self.upstream, tree)
            self.assertEqual(fork.export(tree), [])
            self.assertEqual((tree / rel).read_text(), text)
            # Staging the package leaves it out of the package.
            staged = fork.stage(self.tmp / "staged")
            self.assertFalse((staged / "mlx_lm" / "tests").exists())

    def test_demo_passes_the_arguments_after_a_double_dash_on(self):
        with (
            mock.patch.object(fork, "setup_dev", return_value="python"),
            mock.patch.object(fork.subprocess, "run") as run,
        ):
            run.return_value.returncode = 0
            self.assertEqual(fork.main(["demo", "--", "--model-type", "qwen3_5"]), 0)
        self.assertEqual(run.call_args.args[0][2:], ["--model-type", "qwen3_5"])

    def test_tiny_model_writes_a_folder_that_loads(self):
        from mlx_lm import load

        folder = self.tmp / "tiny"
        with (mock.patch.object(fork, "setup_dev", return_value=sys.executable),):
            self.assertEqual(fork.main(["tiny-model", str(folder)]), 0)
        model, tokenizer = load(str(folder))
        self.assertEqual(model.model_type, "deepseek_v4")
        self.assertTrue(tokenizer.encode("The quick brown fox"))

    def test_tiny_model_mtp_adds_the_block_that_generate_drafts_with(self):
        from mlx_lm import load
        from mlx_lm.generate import generate

        folder = self.tmp / "tiny-mtp"
        with mock.patch.object(fork, "setup_dev", return_value=sys.executable):
            self.assertEqual(fork.main(["tiny-model", str(folder), "--mtp"]), 0)
        # The block is in the folder, and loads where asked for.
        model, tokenizer = load(str(folder))
        self.assertEqual(len(model.mtp), 0)
        model, tokenizer = load(str(folder), model_config={"mtp": True})
        self.assertEqual(len(model.mtp), 1)
        plain = generate(model, tokenizer, "The quick brown fox", max_tokens=8)
        drafted = generate(
            model,
            tokenizer,
            "The quick brown fox",
            max_tokens=8,
            mtp=True,
            num_draft_tokens=2,
        )
        self.assertEqual(drafted, plain)
        with self.assertRaises(SystemExit):
            with contextlib.redirect_stderr(io.StringIO()):
                fork.main(["tiny-model", str(folder), "--model-type", "qwen3", "--mtp"])

    def test_tiny_model_dspark_is_a_0731_folder_that_generate_drafts_with(self):
        from mlx_lm import load
        from mlx_lm.chat_templates.deepseek_v4 import chat_format_of
        from mlx_lm.generate import generate

        folder = self.tmp / "tiny-dspark"
        with mock.patch.object(fork, "setup_dev", return_value=sys.executable):
            self.assertEqual(fork.main(["tiny-model", str(folder), "--dspark"]), 0)
        self.assertEqual(chat_format_of(folder), "0731")
        model, tokenizer = load(str(folder), model_config={"mtp": True})
        self.assertEqual(len(model.dspark), 3)
        prompt = "The quick brown fox"
        plain = generate(model, tokenizer, prompt, max_tokens=12)
        drafted = generate(model, tokenizer, prompt, max_tokens=12, mtp=True)
        self.assertEqual(drafted, plain)
        with self.assertRaises(SystemExit):
            with contextlib.redirect_stderr(io.StringIO()):
                fork.main(
                    ["tiny-model", str(folder), "--model-type", "llama", "--dspark"]
                )

    def test_tiny_model_types_are_the_demos(self):
        sys.path.insert(0, str(fork.ROOT / "benchmarks"))
        try:
            from long_decode import CONFIGS
        finally:
            sys.path.remove(str(fork.ROOT / "benchmarks"))
        self.assertEqual(set(fork.TINY_MODEL_TYPES), set(CONFIGS))
        self.assertIn("{" + ",".join(fork.TINY_MODEL_TYPES) + "}", fork.DEMO_OPTIONS)

    def test_demo_help_lists_the_options_it_passes_on(self):
        script = fork.ROOT / "benchmarks" / "long_decode.py"
        r = subprocess.run(
            [sys.executable, script, "--help"],
            capture_output=True,
            text=True,
            check=True,
        )
        options = set(re.findall(r"(--[a-z][a-z-]*)", r.stdout)) - {"--help"}
        self.assertTrue(options)
        self.assertEqual(
            set(re.findall(r"^  (--[a-z-]+)", fork.DEMO_OPTIONS, re.M)), options
        )

    def test_every_command_and_positional_argument_has_help(self):
        parser = fork.make_parser()
        sub = next(a for a in parser._actions if a.dest == "command")
        helps = {a.dest: a.help for a in sub._choices_actions}
        for name, command in sub.choices.items():
            with self.subTest(command=name):
                self.assertTrue(helps.get(name), name)
                for action in command._actions:
                    if action.dest != "help":
                        self.assertTrue(action.help, f"{name} {action.dest}")

    def test_dev_refuses_to_drop_unsynced_edits(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            path = fork.DEV_TREE / "mlx_lm" / "models" / "base.py"
            path.write_text(path.read_text() + "# unsynced\n")
            with self.assertRaisesRegex(fork.ForkError, "models/base.py"):
                fork.setup_dev(venv=self.tmp / "no-venv")

    def test_patch_that_does_not_apply_names_file_and_hunk(self):
        with self.sandbox():
            rel = "mlx_lm/models/base.py"
            bad = fork.assemble.patch_path("prompt-trie", rel)
            bad.parent.mkdir(parents=True, exist_ok=True)
            bad.write_text(
                f"--- a/{rel}\n+++ b/{rel}\n@@ -1,2 +1,2 @@\n"
                "-this line is not in the file\n+replacement\n context\n"
            )
            with self.assertRaises(fork.ForkError) as e:
                fork.stage(self.tmp / "out")
            self.assertIn("base.py.patch", str(e.exception))
            self.assertIn("hunk no.1", str(e.exception))

    def test_fork_file_may_not_shadow_an_upstream_file(self):
        with self.sandbox():
            shadow = fork.ROOT / "mlx_lm" / "models" / "base.py"
            shadow.parent.mkdir(parents=True, exist_ok=True)
            shadow.write_text("# copied\n")
            with self.assertRaisesRegex(fork.ForkError, "patches/"):
                fork.stage(self.tmp / "out")

    def test_export_onto_the_release_tree(self):
        tree = self.tmp / "upstream"
        shutil.copytree(self.upstream, tree)
        self.assertEqual(fork.export(tree), [])
        staged = fork.stage(self.tmp / "staged")
        for rel in fork.fork_files() + [fork.target_of(p) for p in fork.patch_files()]:
            self.assertEqual((tree / rel).read_bytes(), (staged / rel).read_bytes())

    def test_export_reports_conflicts_per_file_and_hunk(self):
        tree = self.tmp / "upstream"
        shutil.copytree(self.upstream, tree)
        with self.sandbox():
            rel = "mlx_lm/sample_utils.py"
            patch = fork.assemble.patch_path("prompt-trie", rel)
            patch.parent.mkdir(parents=True, exist_ok=True)
            old = (self.upstream / rel).read_text()
            patch.write_text(
                fork.make_patch(rel, old, old.replace("import", "from", 1))
            )
            # Upstream moved on: the line the hunk needs is gone.
            (tree / rel).write_text(old.replace("import", "# import", 1))
            problems = fork.export(tree)
        self.assertEqual(len([p for p in problems if "sample_utils.py.patch" in p]), 1)
        self.assertIn("hunk no.1", problems[-1])


if __name__ == "__main__":
    unittest.main()
