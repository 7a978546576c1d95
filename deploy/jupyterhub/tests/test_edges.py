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
from test_spawner import FakeVoyagerServer  # noqa: E402


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


class PendingEstimateTest(FakeVoyagerServer, unittest.IsolatedAsyncioTestCase):
    """The pending page shows when the server could start, from the
    session view's estimate (the API computes it as for GET /queue)."""

    async def test_pending_page_shows_the_estimate(self):
        from types import SimpleNamespace

        from jupyterhub.objects import Hub

        from voyager_spawner import VoyagerSpawner

        self.fake.script = lambda sid: [("Pending", "Queued", "waiting for 1×GPU: 2 ahead of you"), "gate",
                                        ("Running", "Started", "up")]
        estimate = {"at": "2026-11-29T03:10:00Z",
                    "message": "by 2026-11-29 03:10 UTC at the latest the sessions holding enough GPUs reach their max runtime"}

        class WithEstimate(dict):  # every session the fake creates has one
            def __setitem__(self, k, v):
                super().__setitem__(k, dict(v, estimate=estimate))

        self.fake.sessions = WithEstimate()
        sp = VoyagerSpawner(user=SimpleNamespace(name="ada", escaped_name="ada", url="/user/ada/"), hub=Hub(base_url="/hub/"),
                            voyager_url=self.url, voyager_token="svc-token", api_token="hub-token",
                            oauth_client_id="jupyterhub-user-ada")
        start = asyncio.ensure_future(sp.start())
        want = ("Waiting for GPUs: waiting for 1×GPU: 2 ahead of you. Estimated start: by 2026-11-29 03:10 UTC "
                "at the latest the sessions holding enough GPUs reach their max runtime.")
        for _ in range(500):
            if any(e["message"] == want for e in sp._progress):
                break
            await asyncio.sleep(0.01)
        self.fake.gate.set()
        self.assertEqual(await asyncio.wait_for(start, 10), "http://gpu-7:40001")
        messages = [e["message"] for e in sp._progress]
        self.assertIn(want, messages)
        self.assertEqual(messages[-1], "Server running: up", "an estimate came after the server ran")

    async def test_form_keeps_the_choice_after_a_refusal(self):
        from types import SimpleNamespace

        from jupyterhub.objects import Hub

        from voyager_spawner import SpawnError, VoyagerSpawner

        sp = VoyagerSpawner(user=SimpleNamespace(name="ada", escaped_name="ada", url="/user/ada/"), hub=Hub(base_url="/hub/"),
                            voyager_url=self.url, voyager_token="svc-token", api_token="hub-token",
                            oauth_client_id="jupyterhub-user-ada")
        fresh = await sp._options_form(sp)
        self.assertNotIn('value="a100-quad" checked', fresh)
        # The user picks the 4-GPU profile with 2 GPUs, 1.5 cores, 3 GiB;
        # Voyager refuses (over quota); the form comes back as they left it.
        sp.user_options = sp.options_from_form({"profile": ["a100-quad"], "gpus": ["2"], "cpu": ["1.5"], "memory": ["3"]})
        self.fake.refuse = (422, "Invalid request", "quota: ada may hold 1 GPU")
        with self.assertRaises(SpawnError):
            await asyncio.wait_for(sp.start(), 10)
        form = await sp._options_form(sp)
        self.assertIn('value="a100-quad" checked', form)
        self.assertNotIn('value="" checked', form)
        self.assertIn('name="gpus" id="voyager-gpus" value="2"', form)
        self.assertIn('name="cpu" id="voyager-cpu" value="1.5"', form)
        self.assertIn('name="memory" id="voyager-memory" value="3"', form)

    async def test_session_carries_the_hubs_links(self):
        from types import SimpleNamespace

        from jupyterhub.objects import Hub

        from voyager_spawner import VoyagerSpawner

        def spawner(**kw):
            return VoyagerSpawner(user=SimpleNamespace(name="ada", escaped_name="ada", url="/user/ada/"), hub=Hub(base_url="/hub/"),
                                  voyager_url=self.url, voyager_token="svc-token", api_token="hub-token",
                                  oauth_client_id="jupyterhub-user-ada", **kw)

        sp = spawner(hub_public_url="https://hub.example.org/")
        await asyncio.wait_for(sp.start(), 10)
        env = self.fake.sessions["s0001"]["env"]
        self.assertEqual(env["JUPYTERHUB_PUBLIC_URL"], "https://hub.example.org/user/ada/")
        self.assertEqual(env["JUPYTERHUB_PUBLIC_HUB_URL"], "https://hub.example.org/hub/")
        # Voyager refuses VOYAGER_* names from clients (api/validate.go).
        self.assertFalse([k for k in env if k.startswith("VOYAGER_")], env)
        sp = spawner()
        await asyncio.wait_for(sp.start(), 10)
        self.assertNotIn("JUPYTERHUB_PUBLIC_URL", self.fake.sessions["s0002"]["env"])


if __name__ == "__main__":
    unittest.main()
