"""VoyagerSpawner: each single-user server is a Voyager notebook session.

start() creates the session through Voyager's API (as a service acting for
the hub's user), follows its event stream until the session runs, and
returns the server's URL. progress() relays those events (queue position,
pending reason, image pull, start) as JupyterHub progress events. poll(),
stop(), get_state() and load_state() map onto the session, so the hub
remembers its servers across restarts.
"""

import asyncio
import html
import os
import re
import uuid
from urllib.parse import urlsplit

from jupyterhub.spawner import Spawner
from traitlets import Dict, Integer, Unicode, default

from .client import Client, VoyagerError

# Phases in which a session may still become (or is) a running server.
LIVE = {"Pending", "Bound", "Starting", "Running"}
# Reasons that will never resolve by waiting: fail the spawn at once.
HOPELESS = {"Quota", "Unsatisfiable"}

# The single-user server listens on the port Voyager allocated, which the
# node agent passes as $PORT; the hub's JUPYTERHUB_* variables do
# the rest.
SINGLEUSER = 'exec jupyterhub-singleuser --ip=0.0.0.0 --port="$PORT"'


class VoyagerSpawner(Spawner):
    """Spawns single-user servers as Voyager notebook sessions."""

    voyager_url = Unicode(
        os.environ.get("VOYAGER_URL", "http://127.0.0.1:7070"),
        help="Base URL of Voyager's API. Default: $VOYAGER_URL.",
    ).tag(config=True)

    voyager_token = Unicode(
        os.environ.get("VOYAGER_TOKEN", ""),
        help="A Voyager token with the service role. Default: $VOYAGER_TOKEN.",
    ).tag(config=True)

    image = Unicode(
        "voyager.local/jupyter:latest",
        help="Container image of the single-user server, unless the profile sets one.",
    ).tag(config=True)

    profile = Unicode("", help="Default Voyager profile (GET /api/v1/profiles).").tag(config=True)

    gpus = Integer(0, help="Default number of GPUs.").tag(config=True)
    cpu_milli = Integer(2000, help="Default CPU, in thousandths of a core.").tag(config=True)
    memory_mib = Integer(8192, help="Default memory in MiB.").tag(config=True)
    idle_timeout = Unicode("", help='Idle timeout as a Go duration ("2h"); empty: the cluster default.').tag(config=True)
    max_runtime = Unicode("", help='Maximum run time as a Go duration ("24h"); empty: none.').tag(config=True)
    extra_env = Dict(help="More environment for the server.").tag(config=True)

    # Keep JUPYTERHUB_* and what the server needs; the hub's own PATH and
    # PYTHONPATH mean nothing inside the container.
    drop_env = {"PATH", "PYTHONPATH", "CONDA_ROOT", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV"}

    @default("ip")
    def _default_ip(self):
        return "0.0.0.0"

    @default("options_form")
    def _default_options_form(self):
        return self._options_form

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.session_id = ""
        self.idempotency_key = ""
        self._events = asyncio.Queue()
        self._last_event = None

    # ---- state ----

    def get_state(self):
        state = super().get_state()
        if self.session_id:
            state["voyager_session"] = self.session_id
            state["voyager_idempotency_key"] = self.idempotency_key
        return state

    def load_state(self, state):
        super().load_state(state)
        self.session_id = state.get("voyager_session", "")
        self.idempotency_key = state.get("voyager_idempotency_key", "")

    def clear_state(self):
        super().clear_state()
        self.session_id = ""
        self.idempotency_key = ""

    # ---- options ----

    async def _options_form(self, spawner):
        """Profiles from Voyager, a GPU count, and what is free now."""
        client = self.client()
        try:
            answer = await client.profiles() or {}
            profiles = answer.get("items", []) if isinstance(answer, dict) else answer
        except VoyagerError as e:
            self.log.warning("read Voyager profiles: %s", e)
            profiles = []
        try:
            free = free_now((await client.nodes() or {}).get("items", []))
        except VoyagerError as e:
            self.log.warning("read Voyager nodes: %s", e)
            free = "unknown (Voyager did not answer)"
        opts = ['<option value="">(defaults)</option>']
        for p in profiles:
            name = html.escape(p.get("name", ""))
            desc = html.escape(p.get("description", "") or name)
            opts.append(f'<option value="{name}">{desc}</option>')
        return (
            '<label for="voyager-profile">Profile</label>'
            f'<select class="form-control" name="profile" id="voyager-profile">{"".join(opts)}</select>'
            '<label for="voyager-gpus">GPUs</label>'
            f'<input class="form-control" type="number" min="0" max="64" name="gpus" id="voyager-gpus" value="{self.gpus}">'
            f'<p class="help-block">Free now: {html.escape(free)}</p>'
        )

    def options_from_form(self, formdata):
        opts = {}
        profile = (formdata.get("profile") or [""])[0].strip()
        if profile:
            opts["profile"] = profile
        gpus = (formdata.get("gpus") or [""])[0].strip()
        if gpus:
            if not gpus.isdigit() or int(gpus) > 64:
                raise ValueError(f"GPUs must be a whole number from 0 to 64, not {gpus!r}")
            opts["gpus"] = int(gpus)
        return opts

    # ---- the session ----

    def client(self):
        return Client(self.voyager_url, self.voyager_token, self.user.name)

    def session_request(self):
        """The body of POST /api/v1/sessions for this server."""
        env = {k: v for k, v in self.get_env().items() if k not in self.drop_env}
        env.update(self.extra_env)
        opts = self.user_options or {}
        body = {
            "kind": "notebook",
            "name": server_label(self.name),
            "command": ["/bin/sh", "-c", SINGLEUSER],
            "env": env,
            "resources": {
                "gpus": int(opts.get("gpus", self.gpus)),
                "cpuMilli": self.cpu_milli,
                "memoryMiB": self.memory_mib,
            },
        }
        profile = opts.get("profile", self.profile)
        if profile:
            body["profile"] = profile
        else:
            body["image"] = self.image
        limits = {}
        if self.idle_timeout:
            limits["idleTimeout"] = self.idle_timeout
        if self.max_runtime:
            limits["maxRuntime"] = self.max_runtime
        if limits:
            body["limits"] = limits
        return body

    async def start(self):
        client = self.client()
        if not self.idempotency_key:
            self.idempotency_key = str(uuid.uuid4())
        # A refusal (bad profile, impossible request) raises here, at once,
        # with Voyager's reason: the hub shows it on the spawn page.
        view = await client.create_session(self.session_request(), self.idempotency_key)
        self.session_id = view["id"]
        self.log.info("Voyager session %s for %s", self.session_id, self._log_name)
        # The hub may already be waiting in progress() on this queue: empty
        # it of a previous start's leftovers, never replace it.
        while not self._events.empty():
            self._events.get_nowait()
        status = await self._follow(client)
        return server_url(status)

    async def _follow(self, client):
        """Follows the event stream until the session runs; raises if it
        ends, or waits for a reason that waiting cannot fix."""
        outcome = {}

        def on_event(ev):
            self._last_event = ev
            self._events.put_nowait(ev)
            phase, reason = ev.get("phase"), ev.get("reason")
            if phase == "Running" and ev.get("status", {}).get("urls"):
                outcome["running"] = ev["status"]
            elif ev.get("terminal") or phase not in LIVE:
                outcome["ended"] = ev
            elif phase == "Pending" and reason in HOPELESS:
                outcome["hopeless"] = ev
            return bool(outcome)  # hang up once decided

        last_id = None
        while not outcome:
            last_id = await client.events(self.session_id, on_event, last_id)
            if not outcome:  # stream ended early: read the status and resume
                view = await client.get_session(self.session_id)
                on_event({"phase": view["status"]["phase"], "reason": view["status"].get("reason"),
                          "message": view["status"].get("message", ""), "status": view["status"],
                          "terminal": view["status"]["phase"] not in LIVE})
        if "running" in outcome:
            return outcome["running"]
        ev = outcome.get("ended") or outcome.get("hopeless")
        if "hopeless" in outcome:
            # Free the queue slot: the request can never be served as it is.
            await client.stop_session(self.session_id)
        self._events.put_nowait(None)
        raise VoyagerError(409, f"Voyager could not start the server ({ev.get('reason') or ev.get('phase')})",
                           ev.get("message", ""))

    async def progress(self):
        """Relays Voyager's events in plain words."""
        while True:
            ev = await self._events.get()
            if ev is None:
                return
            yield progress_event(ev)
            if ev.get("phase") == "Running" or ev.get("terminal"):
                return

    async def poll(self):
        if not self.session_id:
            return 0
        try:
            view = await self.client().get_session(self.session_id)
        except VoyagerError as e:
            if e.status == 404:
                return 0
            raise
        st = view["status"]
        if st["phase"] in LIVE:
            return None
        return st.get("exitCode") or 0

    async def stop(self, now=False):
        if not self.session_id:
            return
        client = self.client()
        try:
            await client.stop_session(self.session_id)
        except VoyagerError as e:
            if e.status == 404:
                return
            raise
        # Wait until the session has really ended, as the hub expects.
        for _ in range(600):
            view = await client.get_session(self.session_id)
            if view["status"]["phase"] not in LIVE and view["status"]["phase"] != "Stopping":
                return
            await asyncio.sleep(0.5)
        self.log.warning("Voyager session %s still stopping after 5 minutes", self.session_id)


def free_now(nodes):
    """What is free now, from GET /api/v1/nodes, in plain words:
    "9 of 16 GPUs (NVIDIA A100-SXM4-80GB); largest on one node: 8"."""
    total = free = largest = 0
    models = set()
    simulated = False
    for n in nodes:
        if n.get("cordon"):
            continue
        g = n.get("gpus") or {}
        total += g.get("total", 0)
        free += g.get("free", 0)
        largest = max(largest, g.get("free", 0))
        models.update((n.get("models") or {}).keys())
        simulated = simulated or n.get("simulated", False)
    if total == 0:
        return "no GPUs registered"
    text = f"{free} of {total} GPUs"
    if models:
        text += " (" + ", ".join(sorted(models)) + ")"
    text += f"; largest on one node: {largest}"
    if simulated:
        text += " [simulated GPUs]"
    return text


def server_label(name):
    """A JupyterHub server name as a Voyager session label."""
    label = re.sub(r"[^a-z0-9._-]+", "-", (name or "default").lower()).strip("-._")[:63]
    return label or "default"


def server_url(status):
    """The server's base URL from the session's status: scheme://host:port."""
    url = status["urls"].get("server") or status["urls"].get("jupyter") or ""
    u = urlsplit(url)
    if not u.scheme or not u.netloc:
        raise VoyagerError(502, "Voyager reported no server URL", repr(status["urls"]))
    return f"{u.scheme}://{u.netloc}"


def progress_event(ev):
    """One Voyager event as a JupyterHub progress event."""
    phase = ev.get("phase", "")
    # The event's message already starts with the phase ("Pending: …");
    # the status's own message is the plain reason, which reads better
    # after our prefix.
    message = (ev.get("status") or {}).get("message") or ev.get("message") or phase
    pct = {"Pending": 10, "Bound": 30, "Starting": 50, "Running": 100}.get(phase, 100)
    if isinstance(ev.get("progress"), int):
        pct = ev["progress"]
    text = {
        "Pending": "Waiting for GPUs: " + message,
        "Bound": "GPUs assigned: " + message,
        "Starting": "Starting: " + message,
        "Running": "Server running: " + message,
    }.get(phase, f"{phase}: {message}")
    return {"progress": pct, "message": text}
