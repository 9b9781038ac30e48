# Copyright © 2026 Apple Inc.

import tempfile
import unittest
from pathlib import Path
from unittest import mock

from server_fixture import ServerTestCase, user

from mlx_lm import server


class TestServerModels(ServerTestCase):

    def test_models_lists_the_served_model_without_a_hub_cache(self):
        globals_ = server.scan_cache_dir.__globals__
        with tempfile.TemporaryDirectory() as tmp:
            missing = str(Path(tmp) / "no-hub-cache")
            with mock.patch.dict(globals_, {"HF_HUB_CACHE": missing}):
                status, answer = self.server.request("GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(answer["object"], "list")
        ids = [m["id"] for m in answer["data"]]
        self.assertIn(str(self.path.resolve()), ids)
        # Clients pass that id back as the model.
        body = {"model": ids[-1], "messages": user(), "max_tokens": 3}
        self.assertEqual(self.server.chat(body)[0], 200)


if __name__ == "__main__":
    unittest.main()
