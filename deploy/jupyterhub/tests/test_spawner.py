"""VoyagerSpawner against a fake Voyager API that speaks the real API's
contract (routes, headers, problem+json, Server-Sent Events).

The end-to-end test under a real JupyterHub and `voyager dev` lives beside
this file (test_e2e_hub.py); this one pins the spawner's own logic fast.
Run: /usr/bin/python3 -m unittest discover -s deploy/jupyterhub/tests
"""

import asyncio
import json
import os
import sys
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jupyterhub.objects import Hub  # noqa: E402
from tornado import web  # noqa: E402
from tornado.httpserver import HTTPServer  # noqa: E402
from tornado.netutil import bind_sockets  # noqa: E402

from voyager_spawner import VoyagerError, VoyagerSpawner  # noqa: E402
from voyager_spawner.spawner import server_label, server_url  # noqa: E402


class FakeVoyager:
    """Holds sessions; script() decides the events each new session emits."""

    def __init__(self):
        self.sessions = {}
        self.requests = []
        self.script = lambda sid: [("Pending", "Queued", "waiting for the placer"), ("Running", "Started", "up")]
        self.refuse = None
        self.held_open = 0

    def view(self, sid):
        return self.sessions[sid]


def make_app(fake):
    class Base(web.RequestHandler):
        def prepare(self):
            fake.requests.append((self.request.method, self.request.path, dict(self.request.headers)))
            if self.request.headers.get("Authorization") != "Bearer svc-token":
                self.problem(401, "Unauthorized", "no token")
            elif not self.request.headers.get("X-Voyager-On-Behalf-Of"):
                self.problem(403, "Forbidden", "service must act on behalf of a user")

        def problem(self, code, title, detail):
            self.set_status(code)
            self.set_header("Content-Type", "application/problem+json")
            self.finish(json.dumps({"title": title, "detail": detail, "status": code}))

    class Sessions(Base):
        def post(self):
            if fake.refuse:
                return self.problem(*fake.refuse)
            body = json.loads(self.request.body)
            key = self.request.headers.get("Idempotency-Key")
            for sid, v in fake.sessions.items():
                if v["key"] == key:
                    return self.finish(json.dumps(v))
            sid = f"s{len(fake.sessions) + 1:04d}"
            v = dict(body, id=sid, owner=self.request.headers["X-Voyager-On-Behalf-Of"], key=key,
                     status={"session": sid, "phase": "Pending", "reason": "Queued"})
            v["script"] = list(fake.script(sid))
            fake.sessions[sid] = v
            self.set_status(201)
            self.finish(json.dumps(v))

    class Session(Base):
        def get(self, sid):
            if sid not in fake.sessions:
                return self.problem(404, "Not found", "no session " + sid)
            self.finish(json.dumps(fake.view(sid)))

    class Stop(Base):
        def post(self, sid):
            if sid not in fake.sessions:
                return self.problem(404, "Not found", "no session " + sid)
            fake.sessions[sid]["status"] = {"session": sid, "phase": "Stopped", "reason": "Stopped", "exitCode": 0}
            self.finish(json.dumps({"outcome": "stopping", "session": fake.view(sid)}))

    class Events(Base):
        async def get(self, sid):
            v = fake.sessions[sid]
            self.set_header("Content-Type", "text/event-stream")
            for i, (phase, reason, msg) in enumerate(v["script"], 1):
                if phase == "warning":
                    # A lifecycle warning: its data looks like a live
                    # status event, but it is not a state to relay.
                    w = {"session": sid, "phase": "Pending", "reason": reason, "message": msg, "terminal": False}
                    self.write(f"id: {i}\nevent: warning\ndata: {json.dumps(w)}\n\n")
                    continue
                st = {"session": sid, "phase": phase, "reason": reason, "message": msg}
                if phase == "Running":
                    st["urls"] = {"jupyter": "http://gpu-7:40001/lab?token=x"}
                v["status"] = st
                ev = {"session": sid, "phase": phase, "reason": reason, "message": f"{phase}: {msg}",
                      "terminal": phase in ("Stopped", "Failed", "Succeeded", "Lost"), "status": st}
                self.write(f"id: {i}\nevent: status\ndata: {json.dumps(ev)}\n\n")
                await self.flush()
                await asyncio.sleep(0.01)
            if not ev["terminal"]:
                # Like the real API, a live session's stream stays open:
                # the client must hang up itself.
                fake.held_open += 1
                while not self.request.connection.stream.closed():
                    await asyncio.sleep(0.01)
                return
            self.finish()

    class Profiles(Base):
        def get(self):
            self.finish(json.dumps({"items": [{"name": "a100-small", "description": "1×A100 <b>notebook</b>"}]}))

    class Nodes(Base):
        def get(self):
            self.finish(json.dumps({"items": [
                {"name": "gpu-1", "models": {"NVIDIA A100-SXM4-80GB": 8}, "simulated": True, "gpus": {"total": 8, "free": 6, "used": 2}},
                {"name": "gpu-2", "models": {"NVIDIA A100-SXM4-80GB": 8}, "gpus": {"total": 8, "free": 3, "used": 5}},
                {"name": "gpu-3", "cordon": {"node": "gpu-3"}, "gpus": {"total": 8, "free": 8}},
            ]}))

    return web.Application([
        (r"/api/v1/nodes", Nodes),
        (r"/api/v1/sessions", Sessions),
        (r"/api/v1/sessions/([^/]+)", Session),
        (r"/api/v1/sessions/([^/]+)/stop", Stop),
        (r"/api/v1/sessions/([^/]+)/events", Events),
        (r"/api/v1/profiles", Profiles),
    ])


class SpawnerTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.fake = FakeVoyager()
        sockets = bind_sockets(0, "127.0.0.1")
        self.server = HTTPServer(make_app(self.fake))
        self.server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"

    async def asyncTearDown(self):
        self.server.stop()

    def spawner(self):
        user = SimpleNamespace(name="ada", escaped_name="ada", url="/user/ada/")
        return VoyagerSpawner(user=user, hub=Hub(), voyager_url=self.url,
                              voyager_token="svc-token", api_token="hub-token", oauth_client_id="jupyterhub-user-ada")

    async def test_start_returns_the_server_url_and_progress_relays_events(self):
        sp = self.spawner()
        # The fake keeps the stream open after Running, as the API does:
        # start() returns only because the spawner hangs up.
        url = await asyncio.wait_for(sp.start(), 10)
        self.assertEqual(url, "http://gpu-7:40001")
        self.assertEqual(sp.session_id, "s0001")
        body = self.fake.sessions["s0001"]
        self.assertEqual(body["kind"], "notebook")
        self.assertEqual(body["owner"], "ada")
        self.assertIn("--port=\"$PORT\"", body["command"][-1])
        self.assertEqual(body["env"]["JUPYTERHUB_API_TOKEN"], "hub-token")
        self.assertNotIn("PATH", body["env"])
        self.assertEqual(body["image"], "voyager.local/jupyter:latest")
        events = [e async for e in sp.progress()]
        self.assertEqual([e["message"] for e in events],
                         ["Waiting for GPUs: waiting for the placer", "Server running: up"])
        self.assertEqual(events[-1]["progress"], 100)

    async def test_warning_events_are_not_progress(self):
        self.fake.script = lambda sid: [("Pending", "Queued", "waiting for the placer"),
                                        ("warning", "Preempted", "will be stopped at 10:15 UTC"),
                                        ("Running", "Started", "up")]
        sp = self.spawner()
        self.assertEqual(await asyncio.wait_for(sp.start(), 10), "http://gpu-7:40001")
        events = [e async for e in sp.progress()]
        self.assertEqual([e["message"] for e in events],
                         ["Waiting for GPUs: waiting for the placer", "Server running: up"])

    async def test_state_survives_a_hub_restart(self):
        sp = self.spawner()
        await sp.start()
        state = sp.get_state()
        again = self.spawner()
        again.load_state(state)
        self.assertEqual(again.session_id, sp.session_id)
        self.assertIsNone(await again.poll())
        # A start retried with the same state reuses the session.
        self.assertEqual(await again.start(), "http://gpu-7:40001")
        self.assertEqual(len(self.fake.sessions), 1)

    async def test_stop_and_poll(self):
        sp = self.spawner()
        self.assertEqual(await sp.poll(), 0, "a spawner that never started is not running")
        await sp.start()
        await sp.stop()
        self.assertEqual(self.fake.sessions["s0001"]["status"]["phase"], "Stopped")
        self.assertEqual(await sp.poll(), 0)

    async def test_refusal_fails_at_once_with_the_reason(self):
        self.fake.refuse = (422, "Impossible request", "resources.gpus: no node can ever hold 16×GPU: the largest node has 8")
        with self.assertRaises(VoyagerError) as cm:
            await self.spawner().start()
        self.assertIn("no node can ever hold 16", str(cm.exception))

    async def test_over_quota_fails_at_once_and_frees_the_queue(self):
        self.fake.script = lambda sid: [("Pending", "Quota", "over the GPUs quota of user ada: 8 GPUs held of 8 allowed")]
        sp = self.spawner()
        with self.assertRaises(VoyagerError) as cm:
            await sp.start()
        self.assertIn("quota", str(cm.exception))
        self.assertEqual(self.fake.sessions["s0001"]["status"]["phase"], "Stopped", "the hopeless session is cancelled")

    async def test_session_that_fails_to_start(self):
        self.fake.script = lambda sid: [("Starting", "Pulling", "pulling image"), ("Failed", "ImagePull", "no such image")]
        with self.assertRaises(VoyagerError) as cm:
            await self.spawner().start()
        self.assertIn("no such image", str(cm.exception))

    async def test_options_form_lists_profiles_escaped(self):
        sp = self.spawner()
        form = await sp._options_form(sp)
        self.assertIn('value="a100-small"', form)
        self.assertIn("&lt;b&gt;notebook&lt;/b&gt;", form)
        self.assertIn("Free now: 9 of 16 GPUs (NVIDIA A100-SXM4-80GB); largest on one node: 6 [simulated GPUs]", form)
        self.assertEqual(sp.options_from_form({"profile": ["a100-small"], "gpus": ["2"]}), {"profile": "a100-small", "gpus": 2})
        with self.assertRaises(ValueError):
            sp.options_from_form({"gpus": ["many"]})


class HelpersTest(unittest.TestCase):
    def test_server_label(self):
        self.assertEqual(server_label(""), "default")
        self.assertEqual(server_label("My Server!"), "my-server")

    def test_server_url(self):
        self.assertEqual(server_url({"urls": {"jupyter": "http://n1:40001/lab?token=t"}}), "http://n1:40001")
        with self.assertRaises(VoyagerError):
            server_url({"urls": {}})


if __name__ == "__main__":
    unittest.main()
