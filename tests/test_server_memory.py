# Copyright © 2026 Apple Inc.

import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
from server_fixture import (
    ServerThread,
    make_model_provider,
    make_tiny_model_folder,
    user,
)

from mlx_lm import server

# Run in a fresh process, whose heap has no free chunk that could serve the
# buffer: malloc an 8 MiB buffer after a 16 MiB one was freed and print how
# many new mappings it took (glibc's mallinfo2().hblks, the 4th field).
MMAP_PROBE = """
import ctypes, sys
from mlx_lm import server
if sys.argv[1] == "fix":
    server.fix_mmap_threshold()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
class MallInfo(ctypes.Structure):
    _fields_ = [(str(i), ctypes.c_size_t) for i in range(10)]
libc.mallinfo2.restype = MallInfo
libc.free(libc.malloc(16 << 20))
before = getattr(libc.mallinfo2(), "3")
buffer = libc.malloc(8 << 20)
print(getattr(libc.mallinfo2(), "3") - before)
"""


class TestServerMemory(unittest.TestCase):

    def test_an_idle_server_gives_the_memory_of_its_requests_back(self):
        # Without it the resident memory of a server between bursts of
        # requests moves by 10% with what malloc and MLX's cache kept.
        self.check_idle_release(batched=True)

    def test_an_idle_unbatched_server_gives_the_memory_back(self):
        # A draft model makes the server serve one request at a time.
        self.check_idle_release(batched=False)

    def check_idle_release(self, batched):
        trimmed = threading.Event()
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "model")
            args = [] if batched else ["--draft-model", str(path)]
            thread = ServerThread(path, *args)
            try:
                with mock.patch.object(
                    server, "_malloc_trim", lambda pad: trimmed.set()
                ):
                    body = {"messages": user(), "max_tokens": 8}
                    status, answer = thread.chat(body)
                    self.assertEqual(status, 200, answer)
                    self.assertTrue(trimmed.wait(60), "malloc_trim was not called")
                self.assertEqual(mx.get_cache_memory(), 0)
            finally:
                thread.close()

    @unittest.skipUnless(server._mallopt is not None, "glibc's malloc")
    def test_freed_buffers_go_back_to_the_system(self):
        # glibc raises its mmap threshold to the size of a freed buffer
        # (up to 32 MiB); smaller buffers then come from heaps that keep
        # their memory when freed. The server keeps the threshold.
        with mock.patch.object(server, "fix_mmap_threshold") as fix:
            with tempfile.TemporaryDirectory() as tmp:
                make_model_provider(make_tiny_model_folder(Path(tmp) / "model"))
        fix.assert_called_once()
        mapped = {}
        for arg in ("fix", "no-fix"):
            run = subprocess.run(
                [sys.executable, "-c", MMAP_PROBE, arg],
                capture_output=True,
                text=True,
                timeout=120,
            )
            self.assertEqual(run.returncode, 0, run.stderr)
            mapped[arg] = int(run.stdout)
        self.assertEqual(mapped, {"fix": 1, "no-fix": 0})


if __name__ == "__main__":
    unittest.main()
