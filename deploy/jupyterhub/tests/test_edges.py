"""The rough edges a hub's administrator and its users met, mended:
keygen into a directory that does not exist yet, and plain words (no URL,
no errno) when Voyager cannot be reached.
Run: /usr/bin/python3 -m unittest discover -s deploy/jupyterhub/tests
"""

import asyncio
import os
import socket
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from voyager_spawner.client import Client, VoyagerError  # noqa: E402
from voyager_spawner.tokens import keygen  # noqa: E402


class KeygenTest(unittest.TestCase):
    def test_keygen_makes_its_directory(self):
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "etc", "jupyterhub", "voyager", "hub")
            key, pub = keygen(prefix)
            self.assertTrue(os.path.exists(pub))
            self.assertEqual(stat.S_IMODE(os.stat(key).st_mode), 0o600)
            self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(prefix)).st_mode), 0o700)
            with self.assertRaises(FileExistsError):
                keygen(prefix)


class UnreachableWordsTest(unittest.TestCase):
    def _error(self, url):
        async def call():
            c = Client(url, lambda: "t", "ada", timeout=5)
            with self.assertRaises(VoyagerError) as cm:
                await c.get_session("s1")
            return cm.exception
        return asyncio.run(call())

    def test_refused(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        e = self._error(f"http://127.0.0.1:{port}/some/base")
        self.assertEqual(e.status, 0)
        self.assertIn(f"at 127.0.0.1:{port}: nothing accepts connections there", e.detail)
        self.assertNotIn("Errno", e.detail)
        self.assertNotIn("/api/v1", e.detail)

    def test_unresolvable(self):
        e = self._error("http://voyager-api.invalid:7070")
        self.assertIn("voyager-api.invalid:7070", e.detail)
        self.assertNotIn("Errno", e.detail)
        self.assertTrue("does not resolve" in e.detail or "did not answer" in e.detail, e.detail)


if __name__ == "__main__":
    unittest.main()
