# Copyright © 2026 Apple Inc.

import sys
import tomllib
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import differential  # noqa: E402
import differential_probe as probe  # noqa: E402
import fork  # noqa: E402

PRS = ["server-requests", "load-errors"]


def entry(paths, pr="server-requests", what="w", why="y"):
    return {"what": what, "pr": pr, "why": why, "paths": paths}


def sides():
    fork_side = {
        "env": {"mlx": "1"},
        "server/llama": {
            "bad.n": {"status": 400, "body": {"error": "n must be 1"}},
            "chat": {"status": 200, "body": {"choices": [{"text": "a"}]}},
        },
    }
    pristine = {
        "env": {"mlx": "2"},
        "server/llama": {
            "bad.n": {"status": 200, "body": {"choices": [{"text": "b"}]}},
            "chat": {"status": 200, "body": {"choices": [{"text": "a"}]}},
        },
    }
    return fork_side, pristine


class TestDifferences(unittest.TestCase):

    def test_every_leaf_that_differs_is_named_and_the_versions_are_not(self):
        diffs = differential.differences(*sides())
        self.assertEqual(
            diffs,
            {
                "server/llama/bad.n/body/choices/0/text": ("<missing>", "b"),
                "server/llama/bad.n/body/error": ("n must be 1", "<missing>"),
                "server/llama/bad.n/status": (400, 200),
            },
        )

    def test_a_listed_difference_passes_and_an_unlisted_one_fails(self):
        diffs = differential.differences(*sides())
        lines, ok = differential.report(diffs, [entry(["server/*/bad.n"])], PRS)
        self.assertTrue(ok, lines)
        lines, ok = differential.report(diffs, [], PRS)
        self.assertFalse(ok)
        self.assertIn("UNEXPECTED: server/llama/bad.n (3 outputs differ)", lines)
        # A pattern names its path and the paths below it, no other case.
        narrow = [entry(["server/llama/bad.n/status", "server/llama/bad"])]
        lines, ok = differential.report(diffs, narrow, PRS)
        self.assertFalse(ok)
        self.assertTrue(any("STALE" in x and "server/llama/bad" in x for x in lines))

    def test_an_entry_that_matches_no_difference_is_stale(self):
        diffs = differential.differences(*sides())
        entries = [entry(["server/*/bad.n"]), entry(["server/*/chat"])]
        lines, ok = differential.report(diffs, entries, PRS)
        self.assertFalse(ok)
        self.assertTrue(any(x.startswith("STALE: entry 2") for x in lines), lines)

    def test_an_entry_names_a_pr_of_the_series_and_why(self):
        diffs = differential.differences(*sides())
        for bad in (
            entry(["server/*/bad.n"], pr="no-such-pr"),
            entry(["server/*/bad.n"], why=""),
            entry(["server/*/bad.n"], what="TODO"),
        ):
            lines, ok = differential.report(diffs, [bad], PRS)
            self.assertFalse(ok, bad)
            self.assertTrue(any(x.startswith("BAD ENTRY") for x in lines))

    def test_the_printed_list_is_the_check_once_filled_in(self):
        diffs = differential.differences(*sides())
        stale = entry(["server/*/chat"], what="gone")
        kept = entry(["server/llama/bad.n/status"], what="kept")
        text = differential.list_text(diffs, [stale, kept])
        entries = tomllib.loads(text)["difference"]
        self.assertEqual([e["what"] for e in entries], ["kept", "TODO"])
        # Its model named (only one of differential.MODELS differs there).
        self.assertEqual(entries[1]["paths"], ["server/llama/bad.n"])
        self.assertFalse(differential.report(diffs, entries, PRS)[1])
        entries[1].update(what="new", pr="server-requests", why="better")
        lines, ok = differential.report(diffs, entries, PRS)
        self.assertTrue(ok, lines)

    def test_a_case_that_differs_for_every_model_is_one_pattern(self):
        paths = [f"server/{m}/bad.n/status" for m in differential.MODELS]
        paths += ["cli/llama/chat/stdout", "load/qwen3/bool_in_int"]
        self.assertEqual(
            differential.group_new(paths),
            ["cli/llama/chat", "load/qwen3/bool_in_int", "server/*/bad.n"],
        )

    def test_the_repository_list_names_prs_of_the_series(self):
        names = [p.name for p in fork.series()]
        entries = differential.load_expected()
        self.assertTrue(entries)
        self.assertEqual(differential.check_entries(entries, names), [])


class TestNormalise(unittest.TestCase):

    def test_timings_ids_ports_and_paths_go(self):
        norm = probe.Normaliser({"/tmp/w": "<work>", "/tmp/w/m": "<m>"})
        out = norm(
            {
                "id": "chatcmpl-1234",
                "created": 17,
                "system_fingerprint": "x",
                "data": [{"id": "/tmp/w/m"}],
                "text": "Prompt: 4 tokens, 812.301 tokens-per-sec\n"
                "Peak memory: 0.012 GB\rProcessed   24 tokens (81.2 tok/s)   \n"
                "at 127.0.0.1:40123 in /tmp/w/q",
                "logprob": -1.234567,
            }
        )
        self.assertEqual(
            out,
            {
                "data": [{"id": "<m>"}],
                "text": "Prompt: 4 tokens, <n> tokens-per-sec\n"
                "Peak memory: <n> GB\rProcessed   24 tokens (<n> tok/s)\n"
                "at 127.0.0.1:<port> in <work>/q",
                "logprob": -1.2346,
            },
        )

    def test_a_traceback_is_its_exception(self):
        err = (
            "warning\nTraceback (most recent call last):\n"
            '  File "x.py", line 3, in <module>\n    f()\n'
            "ValueError: Invalid config.json:\n  `a` 1 is not a number\n"
        )
        self.assertEqual(
            probe.Normaliser({}).text(err),
            "warning\nTraceback: ValueError: Invalid config.json:\n"
            "  `a` 1 is not a number",
        )

    def test_stop_words_come_from_the_answers(self):
        answer = {"choices": [{"message": {"content": None, "reasoning": "abcdef"}}]}
        self.assertEqual(probe.stop_word(answer), "de")
        events = [
            {"line": ": keepalive"},
            {"choices": [{"delta": {"content": "a"}}]},
            {"choices": [{"delta": {"content": " "}}]},
            {"choices": [{"delta": {"content": "b"}}]},
            {"choices": [{"delta": {"content": " c"}}]},
            "[DONE]",
        ]
        self.assertEqual(probe.stop_piece(events), " c")
        self.assertEqual(probe.stop_piece(events[:3]), "zzzz")


if __name__ == "__main__":
    unittest.main()
