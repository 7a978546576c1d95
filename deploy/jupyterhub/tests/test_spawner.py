"""VoyagerSpawner against a fake Voyager API that speaks the real API's
contract (routes, headers, problem+json, Server-Sent Events, JWTs checked
by python3-jwt, an independent implementation).

The end-to-end test under a real JupyterHub and `voyager dev` is
cmd/voyager/jupyterhub_test.go; this one pins the spawner's own logic fast.
Run: /usr/bin/python3 -m unittest discover -s deploy/jupyterhub/tests
"""

import asyncio
import json
import os
import sys
import tempfile
import unittest
from types import SimpleNamespace

import jwt  # python3-jwt

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jupyterhub.objects import Hub  # noqa: E402
from tornado import web  # noqa: E402
from tornado.httpserver import HTTPServer  # noqa: E402
from tornado.netutil import bind_sockets  # noqa: E402

import voyager_spawner  # noqa: E402
from voyager_spawner import SpawnError, VoyagerError, VoyagerSpawner  # noqa: E402
from voyager_spawner import profiles as prof  # noqa: E402
from voyager_spawner.spawner import NO_SINGLEUSER, server_label, server_url  # noqa: E402
from voyager_spawner.tokens import Minter, keygen  # noqa: E402

RUNNING = [("Pending", "Queued", "waiting for the placer"), ("Running", "Started", "up")]


class FakeVoyager:
    """Holds sessions; script(sid) decides the events each new session
    emits ("gate" waits for gate to be set, to pace a test)."""

    def __init__(self):
        self.sessions = {}
        self.requests = []
        self.script = lambda sid: RUNNING
        self.refuse = None
        self.public_key = None  # when set, only JWTs it verifies pass
        self.logs = ""
        self.gate = asyncio.Event()
        # What GET /api/v1/nodes answers (devices, where a node has them,
        # only with ?devices=true).
        self.nodes = [
            {"name": "gpu-1", "models": {"NVIDIA A100-SXM4-80GB": 8}, "simulated": True, "gpus": {"total": 8, "free": 6, "used": 2}},
            {"name": "gpu-2", "models": {"NVIDIA A100-SXM4-80GB": 8}, "gpus": {"total": 8, "free": 3, "used": 5}},
            {"name": "gpu-3", "cordon": {"node": "gpu-3"}, "models": {"NVIDIA H100 80GB HBM3": 8}, "gpus": {"total": 8, "free": 8}},
            {"name": "gpu-4", "models": {"NVIDIA H100 80GB HBM3": 4}, "gpus": {"total": 4, "free": 1, "used": 3}},
            {"name": "gpu-5", "models": {"NVIDIA H100 80GB HBM3": 2, "NVIDIA L4": 2}, "gpus": {"total": 4, "free": 2, "used": 2},
             "modelsFree": {"NVIDIA H100 80GB HBM3": 2}},
            # An older Voyager, without modelsFree.
            {"name": "gpu-6", "models": {"NVIDIA T4": 1, "NVIDIA L4": 1}, "gpus": {"total": 2, "free": 1, "used": 1}},
        ]
        self.profiles = {
            "a100-small": {"name": "a100-small", "description": "1×A100 <b>notebook</b>",
                           "resources": {"gpus": 1, "gpuModel": "*A100*", "cpuMilli": 4000, "memoryMiB": 16384}},
            "a100-quad": {"name": "a100-quad", "description": "4×A100", "image": "voyager.local/jupyter:cuda",
                          "resources": {"gpus": 4, "gpuModel": "*A100*", "cpuMilli": 16000, "memoryMiB": 65536},
                          "limits": {"idleTimeout": "1h"}},
        }

    def authorized(self, header):
        if not header.startswith("Bearer "):
            return "no bearer token"
        tok = header[len("Bearer "):]
        if self.public_key is None:
            return None if tok == "svc-token" else "bad token"
        try:
            claims = jwt.decode(tok, self.public_key, algorithms=["ES256", "RS256"], options={"require": ["exp", "sub"]})
        except jwt.PyJWTError as e:
            return f"token refused: {e}"
        return None if "service" in claims.get("roles", []) else "not a service token"


def make_app(fake):
    class Base(web.RequestHandler):
        def prepare(self):
            fake.requests.append((self.request.method, self.request.path, dict(self.request.headers)))
            why = fake.authorized(self.request.headers.get("Authorization", ""))
            if why:
                self.problem(401, "Unauthorized", why)
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
            if body.get("profile") and body["profile"] not in fake.profiles:
                return self.problem(422, "Invalid request", f"profile: no profile {body['profile']!r}")
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
            self.finish(json.dumps(fake.sessions[sid]))

    class Stop(Base):
        def post(self, sid):
            if sid not in fake.sessions:
                return self.problem(404, "Not found", "no session " + sid)
            fake.sessions[sid]["status"] = {"session": sid, "phase": "Stopped", "reason": "Cancelled",
                                            "message": "cancelled while pending by ada via jupyterhub", "exitCode": 0}
            fake.gate.set()  # a stream waiting at its gate reports the stop
            self.finish(json.dumps({"outcome": "stopping", "session": fake.sessions[sid]}))

    class Logs(Base):
        def get(self, sid):
            self.set_header("Content-Type", "text/plain")
            self.finish(fake.logs)

    class Events(Base):
        async def get(self, sid):
            try:
                await self.stream(sid)
            except asyncio.CancelledError:
                pass  # the test's loop is closing under an open stream

        async def stream(self, sid):
            v = fake.sessions[sid]
            self.set_header("Content-Type", "text/event-stream")
            ev = {"terminal": False}
            for i, step in enumerate(v["script"], 1):
                if step == "gate":
                    await fake.gate.wait()
                    st = v["status"]
                    if st["phase"] == "Stopped":  # stopped while it waited, as the real stream says
                        ev = {"session": sid, "phase": "Stopped", "reason": st["reason"], "message": "Stopped: " + st["message"],
                              "terminal": True, "status": st}
                        self.write(f"id: {i}\nevent: status\ndata: {json.dumps(ev)}\n\n")
                        break
                    continue
                phase, reason, msg = step[:3]
                if phase == "warning":
                    # A lifecycle warning: its data looks like a live
                    # status event, but it is not a state to relay.
                    w = {"session": sid, "phase": "Pending", "reason": reason, "message": msg, "terminal": False}
                    self.write(f"id: {i}\nevent: warning\ndata: {json.dumps(w)}\n\n")
                    continue
                st = {"session": sid, "phase": phase, "reason": reason, "message": msg}
                if len(step) > 3:
                    st["exitCode"] = step[3]
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
                while not self.request.connection.stream.closed():
                    await asyncio.sleep(0.01)
                return
            self.finish()

    class Profiles(Base):
        def get(self):
            self.finish(json.dumps({"items": list(fake.profiles.values())}))

    class Profile(Base):
        def get(self, name):
            if name not in fake.profiles:
                return self.problem(404, "Not found", f"no profile {name!r}")
            self.finish(json.dumps(fake.profiles[name]))

    class Nodes(Base):
        def get(self):
            # As the real API: devices only with ?devices=true.
            with_devices = self.get_query_argument("devices", "") == "true"
            items = [n if with_devices else {k: v for k, v in n.items() if k != "devices"} for n in fake.nodes]
            self.finish(json.dumps({"items": items}))

    return web.Application([
        (r"/api/v1/nodes", Nodes),
        (r"/api/v1/sessions", Sessions),
        (r"/api/v1/sessions/([^/]+)", Session),
        (r"/api/v1/sessions/([^/]+)/stop", Stop),
        (r"/api/v1/sessions/([^/]+)/logs", Logs),
        (r"/api/v1/sessions/([^/]+)/events", Events),
        (r"/api/v1/profiles", Profiles),
        (r"/api/v1/profiles/([^/]+)", Profile),
    ])


class FakeVoyagerServer:
    """Serves a FakeVoyager on a free loopback port for each test of an
    asyncio test case: self.fake, and its address self.url."""

    async def asyncSetUp(self):
        self.fake = FakeVoyager()
        sockets = bind_sockets(0, "127.0.0.1")
        self.server = HTTPServer(make_app(self.fake))
        self.server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"

    async def asyncTearDown(self):
        self.server.stop()


class SpawnerTest(FakeVoyagerServer, unittest.IsolatedAsyncioTestCase):

    def spawner(self, **kw):
        user = SimpleNamespace(name="ada", escaped_name="ada", url="/user/ada/")
        args = dict(user=user, hub=Hub(base_url="/hub/"), voyager_url=self.url, voyager_token="svc-token", api_token="hub-token",
                    oauth_client_id="jupyterhub-user-ada")
        args.update(kw)
        return VoyagerSpawner(**args)

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
        self.assertEqual(body["resources"], {"gpus": 0, "cpuMilli": 2000, "memoryMiB": 8192})
        events = [e async for e in sp.progress()]
        self.assertEqual([e["message"] for e in events],
                         ["Waiting for GPUs: waiting for the placer", "Server running: up"])
        self.assertEqual(events[-1]["progress"], 100)

    async def test_every_reader_gets_every_event_in_order(self):
        # Two readers, as a page and its reload (or a second tab): one
        # follows from the start, the other comes after two events. Both
        # get all events, in order; neither takes them from the other.
        self.fake.script = lambda sid: [("Pending", "Queued", "3 sessions ahead of you"),
                                        ("Pending", "Queued", "you are next in line"), "gate",
                                        ("Bound", "Bound", "bound to gpu-1"), ("Running", "Started", "up")]
        sp = self.spawner()
        start = asyncio.ensure_future(sp.start())

        async def read():
            return [e["message"] async for e in sp.progress()]

        await asyncio.sleep(0)
        first = asyncio.ensure_future(read())
        for _ in range(500):
            if len(sp._progress) >= 2:
                break
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(read())
        self.fake.gate.set()
        await asyncio.wait_for(start, 10)
        want = ["Waiting for GPUs: 3 sessions ahead of you", "Waiting for GPUs: you are next in line",
                "GPUs assigned: bound to gpu-1", "Server running: up"]
        self.assertEqual(await asyncio.wait_for(first, 5), want)
        self.assertEqual(await asyncio.wait_for(second, 5), want)
        # A reader after the spawn (a reload of the finished page) too.
        self.assertEqual(await asyncio.wait_for(read(), 5), want)

    async def test_a_queued_user_can_leave_the_queue(self):
        self.fake.script = lambda sid: [("Pending", "Queued", "waiting for 8×GPU: you are next in line"), "gate",
                                        ("Running", "Started", "up")]
        import voyager_spawner.handlers as handlers

        self.addCleanup(setattr, handlers, "registered", handlers.registered)
        self.assertEqual(voyager_spawner.extra_handlers()[0][1], handlers.CancelHandler)
        sp = self.spawner()
        start = asyncio.ensure_future(sp.start())
        for _ in range(500):
            if sp._progress:
                break
            await asyncio.sleep(0.01)
        html = sp._progress[0]["html_message"]
        self.assertIn('action="/hub/voyager/cancel/ada"', html)
        self.assertIn("Leave the queue", html)
        self.assertIn("you are next in line", html)
        await sp.cancel()
        with self.assertRaises(SpawnError) as cm:
            await asyncio.wait_for(start, 10)
        self.assertIn("You left the queue", cm.exception.jupyterhub_message)
        self.assertEqual(self.fake.sessions["s0001"]["status"]["phase"], "Stopped")

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

    async def assertSpawnFails(self, sp, *words):
        with self.assertRaises(SpawnError) as cm:
            await asyncio.wait_for(sp.start(), 10)
        e = cm.exception
        # What JupyterHub shows: jupyterhub_message on the error page and
        # in the progress stream, str() on the spawn form after a quick
        # failure. All three must carry the reason.
        for w in words:
            self.assertIn(w, e.jupyterhub_message)
        self.assertEqual(str(e), e.jupyterhub_message)
        self.assertIsInstance(e, web.HTTPError)
        # progress() ends, so no reader waits for ever.
        await asyncio.wait_for(asyncio.ensure_future(_drain(sp.progress())), 5)
        return e

    async def test_refusal_fails_at_once_with_the_reason(self):
        self.fake.refuse = (422, "Impossible request", "resources.gpus: no node can ever hold 16×GPU: the largest node has 8")
        e = await self.assertSpawnFails(self.spawner(), "Voyager refused this server", "no node can ever hold 16")
        self.assertEqual(e.status_code, 422)

    async def test_voyager_down(self):
        sockets = bind_sockets(0, "127.0.0.1")
        port = sockets[0].getsockname()[1]
        sockets[0].close()  # nothing listens there now
        sp = self.spawner(voyager_url=f"http://127.0.0.1:{port}")
        await self.assertSpawnFails(sp, "Voyager, which runs the servers, is not answering", f"127.0.0.1:{port}")

    async def test_image_without_jupyterhub_singleuser(self):
        self.fake.script = lambda sid: [("Starting", "Starting", "starting container"),
                                        ("Failed", "Exited", "the container exited", 127)]
        self.fake.logs = f"{NO_SINGLEUSER} in this image (PATH=/bin)\n"
        await self.assertSpawnFails(self.spawner(image="busybox:latest"), "The image busybox:latest has no jupyterhub-singleuser")

    async def test_server_that_fails_says_why_with_its_log(self):
        self.fake.script = lambda sid: [("Starting", "Starting", "starting"), ("Failed", "Exited", "exited with code 1", 1)]
        self.fake.logs = "Traceback ...\nModuleNotFoundError: No module named 'jupyterhub'\n"
        await self.assertSpawnFails(self.spawner(), "stopped before it was ready: exited with code 1", "No module named 'jupyterhub'")

    async def test_bad_credentials_are_for_the_administrator(self):
        await self.assertSpawnFails(self.spawner(voyager_token="stale"), "refused the hub's credentials", "administrator")
        await self.assertSpawnFails(self.spawner(voyager_token=""), "no Voyager credentials")

    async def test_over_quota_fails_at_once_and_frees_the_queue(self):
        self.fake.script = lambda sid: [("Pending", "Quota", "over the GPUs quota of user ada: 8 GPUs held of 8 allowed")]
        await self.assertSpawnFails(self.spawner(), "Voyager cannot place this server", "quota")
        self.assertEqual(self.fake.sessions["s0001"]["status"]["phase"], "Stopped", "the hopeless session is cancelled")

    async def test_options_form_lists_profiles_and_free_gpus_by_model(self):
        sp = self.spawner()
        form = await sp._options_form(sp)
        self.assertIn('value="a100-small"', form)
        self.assertIn("&lt;b&gt;notebook&lt;/b&gt;", form)
        self.assertIn("4 GPUs (*A100*), 16 CPUs, 64 GiB", form)
        self.assertIn("Free now (simulated GPUs)", form)
        self.assertIn("<li>NVIDIA A100-SXM4-80GB: 9 of 16 GPUs free</li>", form)
        # gpu-3 is cordoned: its 8 free H100s are not offered.
        self.assertIn("<li>NVIDIA H100 80GB HBM3: 3 of 6 GPUs free</li>", form)
        self.assertIn("<li>NVIDIA L4: 0 of 2 GPUs free</li>", form)
        self.assertIn("<li>NVIDIA L4 / NVIDIA T4: 1 of 2 GPUs free</li>", form)
        # The override fields are blank: a chosen profile keeps its values.
        for name in ("gpus", "cpu", "memory"):
            self.assertIn(f'name="{name}" id="voyager-{name}" value=""', form)

    async def test_form_merge_rule(self):
        # 4-GPU profile, override fields left blank: the profile's GPUs,
        # CPU, memory and image, not the spawner's defaults.
        sp = self.spawner(gpus=1, cpu_milli=200, memory_mib=1024)
        sp.user_options = sp.options_from_form({"profile": ["a100-quad"], "gpus": [""], "cpu": [""], "memory": [""]})
        self.assertEqual(sp.user_options, {"profile": "a100-quad"})
        await sp.start()
        body = self.fake.sessions["s0001"]
        self.assertEqual(body["profile"], "a100-quad")
        self.assertEqual(body["resources"], {"gpus": 4, "gpuModel": "*A100*", "cpuMilli": 16000, "memoryMiB": 65536})
        self.assertEqual(body["image"], "voyager.local/jupyter:cuda")
        self.assertEqual(body["limits"], {"idleTimeout": "1h"})

        # What the user typed wins, field by field; a profile without an
        # image runs the spawner's image (not the agent's busybox).
        sp = self.spawner(gpus=1, cpu_milli=200, memory_mib=1024, image="voyager.local/jupyter:latest")
        sp.user_options = sp.options_from_form({"profile": ["a100-small"], "gpus": ["2"], "cpu": [""], "memory": ["32"]})
        self.assertEqual(sp.user_options, {"profile": "a100-small", "gpus": 2, "memory_mib": 32768})
        await sp.start()
        body = self.fake.sessions["s0002"]
        self.assertEqual(body["resources"], {"gpus": 2, "gpuModel": "*A100*", "cpuMilli": 4000, "memoryMiB": 32768})
        self.assertEqual(body["image"], "voyager.local/jupyter:latest")

        # No profile: the spawner's traits, overridden by what was typed.
        sp = self.spawner(gpus=1, cpu_milli=200, memory_mib=1024)
        sp.user_options = sp.options_from_form({"profile": [""], "cpu": ["0.5"]})
        await sp.start()
        self.assertEqual(self.fake.sessions["s0003"]["resources"], {"gpus": 1, "cpuMilli": 500, "memoryMiB": 1024})
        self.assertNotIn("profile", self.fake.sessions["s0003"])

        # The spawner's default Voyager profile applies when none is chosen.
        sp = self.spawner(profile="a100-quad")
        sp.user_options = {}
        await sp.start()
        self.assertEqual(self.fake.sessions["s0004"]["resources"]["gpus"], 4)

    async def test_fraction_of_a_shared_gpu(self):
        # Typed in the form: GiB of a shared GPU become gpuShareMiB of one GPU.
        sp = self.spawner(gpus=1, cpu_milli=1000, memory_mib=2048)
        sp.user_options = sp.options_from_form({"profile": [""], "gpu_share": ["10"]})
        self.assertEqual(sp.user_options, {"gpu_share_mib": 10240})
        await sp.start()
        self.assertEqual(self.fake.sessions["s0001"]["resources"],
                         {"gpus": 1, "gpuShareMiB": 10240, "cpuMilli": 1000, "memoryMiB": 2048})
        # From a profile_list entry, with a compute share.
        sp = self.spawner(profile_list=[{"display_name": "Small share", "default": True,
                                         "voyager_override": {"gpu_share_mib": 20480, "gpu_compute_percent": 25}}])
        sp.user_options = {}
        await sp.start()
        self.assertEqual(self.fake.sessions["s0002"]["resources"]["gpuShareMiB"], 20480)
        self.assertEqual(self.fake.sessions["s0002"]["resources"]["gpuComputePercent"], 25)
        # Too small a share is refused, saying what would do.
        with self.assertRaisesRegex(ValueError, "GiB of a shared GPU"):
            sp.options_from_form({"gpu_share": ["0.1"]})

    async def test_form_refuses_what_cannot_be_honoured(self):
        sp = self.spawner()
        for form, words in [({"gpus": ["many"]}, "want a whole number from 0 to 64"),
                            ({"cpu": ["0"]}, "want a number of cores"),
                            ({"memory": ["lots"]}, "want GiB")]:
            with self.assertRaises(ValueError) as cm:
                sp.options_from_form(form)
            self.assertIn(words, str(cm.exception))
        sp.user_options = {"profile": "a100-small", "gpus": 0}
        await self.assertSpawnFails(sp, "has 1 GPU: choose a profile without GPUs")
        sp = self.spawner()
        sp.user_options = {"profile": "nope"}
        await self.assertSpawnFails(sp, "no profile 'nope': want one of a100-small, a100-quad")

    async def test_profile_list_in_kubespawners_shape(self):
        plist = [
            {"display_name": "Small", "slug": "small", "description": "CPU only",
             "voyager_override": {"gpus": 0, "cpu_milli": 1000, "memory_mib": 2048}},
            {"display_name": "GPU", "description": "A100s", "default": True,
             "voyager_override": {"voyager_profile": "a100-small", "image": "voyager.local/jupyter:gpu"},
             "profile_options": {"gpus": {"display_name": "GPUs", "choices": {
                 "one": {"display_name": "1 GPU", "default": True, "voyager_override": {"gpus": 1}},
                 "four": {"display_name": "4 GPUs", "voyager_override": {"gpus": 4, "memory_mib": 131072}}}}}},
        ]
        sp = self.spawner(profile_list=plist)
        form = await sp._options_form(sp)
        self.assertIn('<input type="radio" name="profile" value="gpu" checked>', form)
        self.assertIn('name="profile-option-gpu--gpus"', form)
        self.assertIn('<option value="four">4 GPUs</option>', form)
        self.assertNotIn("Default server", form)
        sp.user_options = sp.options_from_form({"profile": ["gpu"], "profile-option-gpu--gpus": ["four"], "gpus": [""]})
        self.assertEqual(sp.user_options, {"profile": "gpu", "profile_options": {"gpus": "four"}})
        await sp.start()
        body = self.fake.sessions["s0001"]
        # Voyager's a100-small, then the entry's override, then the choice's.
        self.assertEqual(body["profile"], "a100-small")
        self.assertEqual(body["image"], "voyager.local/jupyter:gpu")
        self.assertEqual(body["resources"], {"gpus": 4, "gpuModel": "*A100*", "cpuMilli": 4000, "memoryMiB": 131072})
        # No choice made: the default entry with its default choice.
        sp = self.spawner(profile_list=plist)
        sp.user_options = {}
        await sp.start()
        self.assertEqual(self.fake.sessions["s0002"]["resources"]["gpus"], 1)
        # A callable profile_list, async too.

        async def plist_for(spawner):
            return plist[:1]
        sp = self.spawner(profile_list=plist_for)
        sp.user_options = {"profile": "small"}
        await sp.start()
        self.assertEqual(self.fake.sessions["s0003"]["resources"], {"gpus": 0, "cpuMilli": 1000, "memoryMiB": 2048})

    def test_bad_profile_list_is_refused_when_configured(self):
        for plist, words in [
            ([{"display_name": "X", "kubespawner_override": {"cpu_limit": 2}}], "voyager_override where KubeSpawner reads kubespawner_override"),
            ([{"display_name": "X", "voyager_override": {"gpu": 2}}], "voyager_override has 'gpu': want one of"),
            ([{"display_name": "X", "voyager_override": {"gpus": "2"}}], "want a whole number"),
            ([{"display_name": "X"}, {"display_name": "x"}], "slug 'x' is used twice"),
            ([{"display_name": "X", "profile_options": {"g": {"choices": {}}}}], "non-empty dict of choices"),
        ]:
            with self.assertRaises(Exception) as cm:
                self.spawner(profile_list=plist)
            self.assertIn(words, str(cm.exception))

    async def test_minted_tokens_are_checked_by_pyjwt_and_renewed(self):
        d = tmpdir(self)
        key, pub = keygen(os.path.join(d, "hub"))
        self.assertEqual(os.stat(key).st_mode & 0o777, 0o600)
        with open(pub) as f:
            self.fake.public_key = f.read()
        sp = self.spawner(voyager_token="", voyager_private_key_file=key, voyager_token_lifetime=60)
        self.assertEqual(await asyncio.wait_for(sp.start(), 10), "http://gpu-7:40001")
        # The fake verified every request's token with python3-jwt.
        tok = self.fake.requests[-1][2]["Authorization"].split()[1]
        claims = jwt.decode(tok, self.fake.public_key, algorithms=["ES256"])
        self.assertEqual(claims["sub"], "jupyterhub")
        self.assertEqual(claims["roles"], ["service"])
        self.assertEqual(claims["exp"] - claims["iat"], 60)
        # A static token that is not the fake's is refused.
        await self.assertSpawnFails(self.spawner(voyager_token="svc-token"), "refused the hub's credentials")

    async def test_minted_tokens_sign_the_user_and_her_groups(self):
        d = tmpdir(self)
        key, pub = keygen(os.path.join(d, "hub"))
        with open(pub) as f:
            self.fake.public_key = f.read()

        async def auth_state():
            return {"groups": ["staff", "cv"], "access_token": "x"}
        user = SimpleNamespace(name="ada", escaped_name="ada", url="/user/ada/",
                               groups=[SimpleNamespace(name="cv")], get_auth_state=auth_state)
        sp = self.spawner(user=user, voyager_token="", voyager_private_key_file=key, voyager_token_lifetime=60)
        self.assertEqual(await asyncio.wait_for(sp.start(), 10), "http://gpu-7:40001")
        method, path, headers = next(r for r in self.fake.requests if r[0] == "POST" and r[1] == "/api/v1/sessions")
        claims = jwt.decode(headers["Authorization"].split()[1], self.fake.public_key, algorithms=["ES256"])
        self.assertEqual(claims["voyager_on_behalf_of"], {"sub": "ada", "groups": ["cv", "staff"]})
        self.assertEqual(headers["X-Voyager-On-Behalf-Of"], "ada")
        # Switched off, the token signs no user.
        sp = self.spawner(user=user, voyager_token="", voyager_private_key_file=key, voyager_sign_groups=False)
        self.assertEqual(await asyncio.wait_for(sp.start(), 10), "http://gpu-7:40001")
        claims = jwt.decode(self.fake.requests[-1][2]["Authorization"].split()[1], self.fake.public_key, algorithms=["ES256"])
        self.assertNotIn("voyager_on_behalf_of", claims)


class MinterTest(unittest.TestCase):
    def test_renews_at_half_life_and_signs_rs256_and_es256(self):
        d = tmpdir(self)
        now = [1_000_000.0]
        for kind, alg in (("ec", "ES256"), ("rsa", "RS256")):
            key, pub = keygen(os.path.join(d, kind), kind)
            with open(pub) as f:
                public = f.read()
            m = Minter(key, "hub", ["service"], 60, audience="voyager", issuer="hub.example", kid="k1",
                       roles_claim="realm_access.roles", clock=lambda: now[0])
            t1 = m.token()
            self.assertEqual(jwt.get_unverified_header(t1)["alg"], alg)
            self.assertEqual(jwt.get_unverified_header(t1)["kid"], "k1")
            c = jwt.decode(t1, public, algorithms=[alg], audience="voyager", issuer="hub.example",
                           options={"verify_exp": False, "verify_iat": False, "verify_nbf": False})
            self.assertEqual(c["realm_access"], {"roles": ["service"]})
            self.assertEqual(c["exp"], 1_000_060)
            now[0] += 29
            self.assertEqual(m.token(), t1, "kept while more than half its life is left")
            now[0] += 2
            t2 = m.token()
            self.assertNotEqual(t2, t1, "renewed past half its life")
            self.assertEqual(jwt.decode(t2, public, algorithms=[alg], audience="voyager", issuer="hub.example",
                                        options={"verify_exp": False, "verify_iat": False, "verify_nbf": False})["exp"], 1_000_091)
            self.assertEqual(m.minted, 2)
            # Per user and groups: one token each, kept like the service's.
            ta, tb = m.token("ada", ["cv"]), m.token("bob", [])
            self.assertEqual(m.token("ada", ["cv"]), ta)
            self.assertNotEqual(m.token("ada", ["cv", "nlp"]), ta, "new groups: a new token")
            ca = jwt.decode(ta, public, algorithms=[alg], audience="voyager", issuer="hub.example",
                            options={"verify_exp": False, "verify_iat": False, "verify_nbf": False})
            self.assertEqual(ca["voyager_on_behalf_of"], {"sub": "ada", "groups": ["cv"]})
            self.assertNotEqual(ta, tb)
            self.assertEqual(m.minted, 5)
            now[0] = 1_000_000.0

    def test_bad_key_files_say_what_is_wanted(self):
        d = tmpdir(self)
        bad = os.path.join(d, "bad.pem")
        with open(bad, "w") as f:
            f.write("not a key")
        with self.assertRaises(ValueError) as cm:
            Minter(bad, "hub", ["service"], 60).token()
        self.assertIn("want an unencrypted PEM private key", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            Minter(os.path.join(d, "missing.pem"), "hub", ["service"], 60).token()
        self.assertIn("missing.pem", str(cm.exception))


def tmpdir(test):
    """A temporary directory that is removed when test ends."""
    d = tempfile.TemporaryDirectory()
    test.addCleanup(d.cleanup)
    return d.name


async def _drain(agen):
    return [e async for e in agen]


class HelpersTest(unittest.TestCase):
    def test_server_label(self):
        self.assertEqual(server_label(""), "default")
        self.assertEqual(server_label("My Server!"), "my-server")

    def test_server_url(self):
        self.assertEqual(server_url({"urls": {"jupyter": "http://n1:40001/lab?token=t"}}), "http://n1:40001")
        with self.assertRaises(VoyagerError):
            server_url({"urls": {}})

    def test_voyager_profile_summary_names_shm_and_volumes(self):
        # What a user choosing the profile gets, shown in the spawn form.
        [p] = prof.from_voyager([{"name": "train", "resources": {"gpus": 2, "cpuMilli": 8000, "memoryMiB": 65536},
                                  "shmMiB": 16384, "volumes": [{"name": "datasets", "mountPath": "/data", "readOnly": True},
                                                               {"name": "results", "mountPath": "/results"}]}])
        self.assertEqual(p["summary"], "2 GPUs, 8 CPUs, 64 GiB; 16 GiB /dev/shm, volumes datasets at /data (read-only), results at /results")
        [q] = prof.from_voyager([{"name": "plain", "resources": {"gpus": 1}}])
        self.assertEqual(q["summary"], "1 GPU")
        form = prof.form_html([p], False, "", "")
        self.assertIn("16 GiB /dev/shm, volumes datasets at /data (read-only)", form)

    def test_summary_counts_in_words(self):
        self.assertEqual(prof.summary({"gpus": 1, "cpu_milli": 1000, "memory_mib": 1536}), "1 GPU, 1 CPU, 1.5 GiB")


if __name__ == "__main__":
    unittest.main()
