# Copyright © 2026 Apple Inc.

import shutil
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
        return mock.patch.multiple(
            fork,
            ROOT=root,
            PATCHES=root / "patches",
            DEV_TREE=root / "build" / "dev",
        )

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
        staged = fork.stage(self.tmp / "staged")
        for patch in fork.patch_files():
            rel = fork._target_of(patch)
            regenerated = fork.make_patch(
                rel,
                (self.upstream / rel).read_text(),
                (staged / rel).read_text(),
            )
            self.assertEqual(regenerated, patch.read_text(), patch)

    def test_dev_tree_edit_becomes_a_patch_and_back(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            rel = Path("mlx_lm/models/base.py")
            edited = fork.DEV_TREE / rel
            text = edited.read_text() + "\n# an edit in the dev tree\n"
            edited.write_text(text)
            self.assertEqual(fork._pending_edits(), [rel])

            self.assertEqual(
                fork.sync_patches(), ["wrote patches/mlx_lm/models/base.py.patch"]
            )
            self.assertEqual(fork._pending_edits(), [])
            self.assertEqual(fork.sync_patches(), [])

            # The patch alone rebuilds the edit.
            staged = fork.stage(self.tmp / "again")
            self.assertEqual((staged / rel).read_text(), text)

            # A new file written in the dev tree moves into the repository.
            (fork.DEV_TREE / "mlx_lm" / "models" / "brand_new.py").write_text("x = 1\n")
            self.assertEqual(
                fork.sync_patches()[0], "new file mlx_lm/models/brand_new.py"
            )
            self.assertTrue((fork.ROOT / "mlx_lm/models/brand_new.py").is_file())

            # Undoing the edit removes the patch.
            edited.write_text((self.upstream / rel).read_text())
            self.assertEqual(
                fork.sync_patches(), ["removed patches/mlx_lm/models/base.py.patch"]
            )

    def test_edit_of_an_upstream_test_becomes_a_tests_patch(self):
        with self.sandbox():
            fork.stage(fork.DEV_TREE, link=True)
            rel = Path("tests/test_models.py")
            edited = fork.DEV_TREE / rel
            text = edited.read_text() + "\n# an edit in the dev tree\n"
            edited.write_text(text)
            self.assertEqual(fork._pending_edits(), [rel])
            self.assertEqual(
                fork.sync_patches(), ["wrote patches/tests/test_models.py.patch"]
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
            mock.patch.object(fork, "_reexec_with_patch_ng"),
            mock.patch.object(fork, "setup_dev", return_value="python"),
            mock.patch.object(fork.subprocess, "run") as run,
        ):
            run.return_value.returncode = 0
            self.assertEqual(fork.main(["demo", "--", "--model-type", "qwen3_5"]), 0)
        self.assertEqual(run.call_args.args[0][2:], ["--model-type", "qwen3_5"])

    def test_tiny_model_writes_a_folder_that_loads(self):
        from mlx_lm import load

        folder = self.tmp / "tiny"
        with (
            mock.patch.object(fork, "_reexec_with_patch_ng"),
            mock.patch.object(fork, "setup_dev", return_value=sys.executable),
        ):
            self.assertEqual(fork.main(["tiny-model", str(folder)]), 0)
        model, tokenizer = load(str(folder))
        self.assertEqual(model.model_type, "deepseek_v4")
        self.assertTrue(tokenizer.encode("The quick brown fox"))

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
            bad = fork.PATCHES / (rel + ".patch")
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
        for rel in fork.fork_files() + [fork._target_of(p) for p in fork.patch_files()]:
            self.assertEqual((tree / rel).read_bytes(), (staged / rel).read_bytes())

    def test_export_reports_conflicts_per_file_and_hunk(self):
        tree = self.tmp / "upstream"
        shutil.copytree(self.upstream, tree)
        with self.sandbox():
            rel = "mlx_lm/models/base.py"
            patch = fork.PATCHES / (rel + ".patch")
            patch.parent.mkdir(parents=True, exist_ok=True)
            old = (self.upstream / rel).read_text()
            patch.write_text(
                fork.make_patch(rel, old, old.replace("import", "from", 1))
            )
            # Upstream moved on: the line the hunk needs is gone.
            (tree / rel).write_text(old.replace("import", "# import", 1))
            problems = fork.export(tree)
        self.assertEqual(len([p for p in problems if "base.py.patch" in p]), 1)
        self.assertIn("hunk no.1", problems[-1])


if __name__ == "__main__":
    unittest.main()
