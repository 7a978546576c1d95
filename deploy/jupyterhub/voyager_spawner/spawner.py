"""VoyagerSpawner: each single-user server is a Voyager notebook session.

start() creates the session through Voyager's API (as a service acting for
the hub's user), follows its event stream until the session runs, and
returns the server's URL. Every event is kept in the spawn's progress log,
which progress() replays from its start for each reader (a reloaded page,
a second tab), then follows. poll(), stop(), get_state() and load_state()
map onto the session, so the hub remembers its servers across restarts.
Failures raise SpawnError, whose jupyterhub_message is the reason in
plain words, as the hub shows it on the spawn form and the error page.
"""

import asyncio
import html
import inspect
import os
import re
import uuid
from urllib.parse import urlsplit

from jupyterhub.spawner import Spawner
from jupyterhub.utils import url_escape_path, url_path_join
from tornado import web
from traitlets import Any, Bool, Dict, Integer, List, Unicode, Union, default, validate

from . import devices as dev
from . import profiles as prof
from .client import Client, VoyagerError
from . import handlers
from .handlers import CANCEL_PATH
from .tokens import SigningKeyError, shared_minter

# Phases in which a session may still become (or is) a running server.
LIVE = {"Pending", "Bound", "Starting", "Running"}
# Reasons that will never resolve by waiting: fail the spawn at once.
HOPELESS = {"Quota", "Unsatisfiable"}

# The exit code and first words of the line the server's command writes
# when the image has no jupyterhub-singleuser.
NO_SINGLEUSER_EXIT = 127
NO_SINGLEUSER = "voyager-spawner: no jupyterhub-singleuser"

# The single-user server listens on the port Voyager allocated, which the
# node agent passes as $PORT; the hub's JUPYTERHUB_* variables do the rest.
SINGLEUSER = (
    "command -v jupyterhub-singleuser >/dev/null 2>&1 || "
    f'{{ echo "{NO_SINGLEUSER} in this image (PATH=$PATH)" >&2; exit {NO_SINGLEUSER_EXIT}; }}; '
    'exec jupyterhub-singleuser --ip=0.0.0.0 --port="$PORT"'
)


class SpawnError(web.HTTPError):
    """A spawn that failed, with the reason the user reads.

    JupyterHub shows jupyterhub_message on its error page and in the
    progress stream ("Spawn failed: …"), and str() of an HTTPError on the
    spawn form it renders again after a quick failure: all three say the
    same plain words. voyager is the VoyagerError behind it, if any.
    """

    def __init__(self, message, status=500, voyager=None):
        super().__init__(status, "%s", message)
        self.jupyterhub_message = message
        self.voyager = voyager

    def __str__(self):
        return self.jupyterhub_message


class VoyagerSpawner(Spawner):
    """Spawns single-user servers as Voyager notebook sessions.

    Register with ``c.JupyterHub.spawner_class = "voyager"``. Every
    option below is documented, with examples, in the package's README.
    """

    # ---- reaching Voyager ----

    voyager_url = Unicode(
        help="""Base URL of Voyager's API, as the hub reaches it (http://voyager-api:7070).
        Default: $VOYAGER_URL, else http://127.0.0.1:7070.""",
    ).tag(config=True)

    @default("voyager_url")
    def _default_url(self):
        return os.environ.get("VOYAGER_URL", "http://127.0.0.1:7070")

    voyager_private_key_file = Unicode(
        help="""PEM private key (EC P-256 or RSA) with which the spawner signs its own short-lived
        Voyager service tokens (ES256 or RS256). Give Voyager the public half in
        VOYAGER_JWT_PUBLIC_KEYS. `python3 -m voyager_spawner keygen PREFIX` writes a pair.
        The file is read again when it changes. Default: $VOYAGER_PRIVATE_KEY_FILE.""",
    ).tag(config=True)

    @default("voyager_private_key_file")
    def _default_key_file(self):
        return os.environ.get("VOYAGER_PRIVATE_KEY_FILE", "")

    voyager_token = Unicode(
        help="""A fixed Voyager token with the service role, used only when
        voyager_private_key_file is empty. It expires like every Voyager token,
        and every spawn fails from then on: meant for trials, not for a hub
        that runs for days. Default: $VOYAGER_TOKEN.""",
    ).tag(config=True)

    @default("voyager_token")
    def _default_token(self):
        return os.environ.get("VOYAGER_TOKEN", "")

    voyager_token_subject = Unicode(
        "jupyterhub", help="The sub claim of the tokens the spawner mints: the service's name in Voyager's logs."
    ).tag(config=True)
    voyager_token_roles = List(
        Unicode(), ["service"],
        help="Roles put in minted tokens; Voyager's service role (VOYAGER_JWT_SERVICE_ROLE) lets the hub act for users.",
    ).tag(config=True)
    voyager_token_roles_claim = Unicode(
        "roles", help="Claim that carries the roles (VOYAGER_JWT_ROLES_CLAIM); dots nest objects."
    ).tag(config=True)
    voyager_token_lifetime = Integer(
        300, min=10,
        help="Seconds a minted token is valid; a new one is minted when half of that has passed.",
    ).tag(config=True)
    voyager_token_audience = Unicode("", help="aud claim of minted tokens (VOYAGER_JWT_AUDIENCE); empty: none.").tag(config=True)
    voyager_token_issuer = Unicode("", help="iss claim of minted tokens (VOYAGER_JWT_ISSUER); empty: none.").tag(config=True)
    voyager_token_kid = Unicode("", help="kid header of minted tokens, when Voyager's key file is a JWKS with several keys.").tag(config=True)
    voyager_request_timeout = Integer(30, min=1, help="Seconds one request to Voyager may take.").tag(config=True)
    voyager_sign_groups = Bool(
        True,
        help="""Sign the user and her groups into every minted token (claim voyager_on_behalf_of): her
        JupyterHub groups, and the list under voyager_auth_state_groups_key in her auth state. Voyager
        then gives hub users their groups' volumes, profiles, quotas and team. Needs
        voyager_private_key_file: a fixed voyager_token carries no groups.""",
    ).tag(config=True)
    voyager_auth_state_groups_key = Unicode(
        "groups",
        help="""Key of the user's auth state (Authenticator.enable_auth_state) that lists her groups, as
        OAuthenticator's and LDAPAuthenticator's may; empty: the auth state is not read.""",
    ).tag(config=True)

    # ---- what a server gets ----

    image = Unicode(
        "voyager.local/jupyter:latest",
        help="Container image of the single-user server when the chosen profile names none. "
        "It must contain jupyterhub-singleuser (`make image` builds one from Debian's packages).",
    ).tag(config=True)
    profile = Unicode(
        "", help="Voyager profile (GET /api/v1/profiles) used when the user chooses none; empty: the traits below."
    ).tag(config=True)
    gpus = Integer(0, min=0, max=64, help="GPUs of a server whose profile sets none.").tag(config=True)
    gpu_model = Unicode("", help='GPU model pattern ("*A100*") of a server whose profile sets none; empty: any.').tag(config=True)
    cpu_milli = Integer(2000, min=1, help="CPU in thousandths of a core, of a server whose profile sets none.").tag(config=True)
    memory_mib = Integer(8192, min=1, help="Memory in MiB of a server whose profile sets none.").tag(config=True)
    idle_timeout = Unicode("", help='Idle timeout as a Go duration ("2h"); empty: the profile\'s, else the cluster default.').tag(config=True)
    max_runtime = Unicode("", help='Maximum run time as a Go duration ("24h"); empty: the profile\'s, else none.').tag(config=True)
    extra_env = Dict(help="More environment for every server (over the profile's).").tag(config=True)
    hub_public_url = Unicode(
        "",
        help="""The hub's URL as users' browsers reach it (https://hub.example.org); empty: the
        JUPYTERHUB_PUBLIC_URL environment variable, else unknown. Set, every server's session carries
        JUPYTERHUB_PUBLIC_URL (the server through the hub, under its base URL) and
        JUPYTERHUB_PUBLIC_HUB_URL (the hub's own pages), the names JupyterHub 4 gives them, so
        that Voyager's web console opens the server and stops it through the hub (its home
        page), which then knows it stopped. (Voyager refuses VOYAGER_* names from clients.)""",
    ).tag(config=True)

    @default("hub_public_url")
    def _default_hub_public_url(self):
        return os.environ.get("JUPYTERHUB_PUBLIC_URL", "")
    profile_list = Union(
        [List(Dict()), Any()],
        default_value=[],
        help="""Profiles offered on the spawn form, in KubeSpawner's shape: a list of dicts with
        display_name, slug, description, default, voyager_override (image, gpus, gpu_model,
        cpu_milli, memory_mib, idle_timeout, max_runtime, env, voyager_profile) and
        profile_options ({name: {display_name, choices: {key: {display_name, default,
        voyager_override}}}}); or a function (spawner) -> list, maybe async. Empty: the
        profiles Voyager holds (GET /api/v1/profiles).""",
    ).tag(config=True)

    @validate("profile_list")
    def _check_profile_list(self, proposal):
        v = proposal["value"]
        if callable(v):
            return v
        prof.normalize_profile_list(v)  # refuse a bad list when the hub loads its config
        return v

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
        self._progress = []
        self._progress_done = False
        self._progress_changed = asyncio.Event()
        self._cancelled = False
        self._auth_state_groups = []
        self._refused_form = None

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

    # ---- credentials ----

    def _token(self, user=None, groups=()):
        if self.voyager_private_key_file:
            m = shared_minter(self.voyager_private_key_file, self.voyager_token_subject, self.voyager_token_roles,
                              self.voyager_token_lifetime, self.voyager_token_audience, self.voyager_token_issuer,
                              self.voyager_token_kid, self.voyager_token_roles_claim)
            return m.token(user, groups) if self.voyager_sign_groups and user is not None else m.token()
        if not self.voyager_token:
            raise SigningKeyError("the hub has no Voyager credentials: set VoyagerSpawner.voyager_private_key_file "
                                  "(or, for a trial, voyager_token)")
        return self.voyager_token

    def user_groups(self):
        """The user's groups as signed into her tokens: her JupyterHub
        groups, then those of her auth state (read at the last spawn or
        form), in order, each once."""
        names = []
        for g in list(getattr(self.user, "groups", None) or []) + list(self._auth_state_groups):
            name = getattr(g, "name", g)
            if isinstance(name, str) and name and name not in names:
                names.append(name)
        return names

    async def _read_auth_state_groups(self):
        """Reads the groups listed in the user's auth state, if configured."""
        key, get = self.voyager_auth_state_groups_key, getattr(self.user, "get_auth_state", None)
        if not (key and get and self.voyager_sign_groups):
            return
        try:
            st = await get() or {}
        except Exception as e:  # an auth state that cannot be read: no groups from it
            self.log.warning("read auth state of %s: %s", self.user.name, e)
            return
        gs = st.get(key) if isinstance(st, dict) else None
        if isinstance(gs, str):
            gs = [g for g in gs.replace(",", " ").split() if g]
        self._auth_state_groups = [g for g in (gs or []) if isinstance(g, str)]

    def client(self):
        return Client(self.voyager_url, lambda: self._token(self.user.name, self.user_groups()), self.user.name,
                      self.voyager_request_timeout)

    # ---- profiles and the form ----

    async def _profiles(self, client):
        """(profiles, hub_profiles): the hub's profile_list, else Voyager's."""
        pl = self.profile_list
        if callable(pl):
            pl = pl(self)
            if inspect.isawaitable(pl):
                pl = await pl
        if pl:
            return prof.normalize_profile_list(pl), True
        answer = await client.profiles() or {}
        items = answer.get("items", []) if isinstance(answer, dict) else answer
        return prof.from_voyager(items), False

    def _trait_fields(self):
        f = {"image": self.image, "gpus": self.gpus, "cpu_milli": self.cpu_milli, "memory_mib": self.memory_mib}
        for k in ("gpu_model", "idle_timeout", "max_runtime"):
            if getattr(self, k):
                f[k] = getattr(self, k)
        return f

    async def _options_form(self, spawner):
        """Profiles, override fields, the GPU kinds to choose from and what
        is free now of each, for this user."""
        await self._read_auth_state_groups()
        client = self.client()
        error = ""
        try:
            profiles, hub = await self._profiles(client)
        except (VoyagerError, ValueError) as e:
            self.log.warning("read profiles: %s", e)
            profiles, hub, error = [], False, f"Profiles unavailable: {e}"
        # After a refused request the form comes back as the user left it:
        # as he typed it when the form itself was wrong, else as the
        # user_options Voyager refused.
        previous, self._refused_form = self._refused_form or prof.typed_from_options(self.user_options), None
        try:
            choices = dev.device_choices((await client.nodes() or {}).get("items", []), self.user.name)
            free = dev.free_html(choices)
        except VoyagerError as e:
            self.log.warning("read Voyager nodes: %s", e)
            choices, free = [], "<p>Free now: unknown (Voyager did not answer).</p>"
        select = dev.select_html(choices, previous.get("device", ""))
        return prof.form_html(profiles, hub, prof.summary(self._trait_fields()), free, error, previous, select)

    def options_from_form(self, formdata):
        try:
            return prof.options_from_form(formdata)
        except ValueError:
            # The hub shows the form again with the error: keep what he typed.
            self._refused_form = prof.form_typed(formdata)
            raise

    async def resolve(self, client):
        """The merged fields of this spawn and the Voyager profile it names
        (see profiles.py for the rule). Raises ValueError for a choice
        that does not exist or cannot be honoured."""
        opts = self.user_options or {}
        fields = self._trait_fields()
        profiles = []
        if opts.get("profile") or self.profile_list:
            profiles, _ = await self._profiles(client)
        chosen, choices = prof.choose(profiles, opts)
        override = {}
        if chosen is not None:
            override.update(chosen["override"])
            for c in choices:
                override.update(c["override"])
        vname = override.pop("voyager_profile", "") or (self.profile if chosen is None else "")
        vfields = {}
        if vname:
            vfields = prof.voyager_fields(await client.profile(vname))
        fields.update(vfields)
        fields.update(override)
        asked = prof.user_fields(opts)
        if asked.get("gpus") == 0 and vfields.get("gpus"):
            raise ValueError(f"profile {vname!r} has {prof.plural(vfields['gpus'], 'GPU')}: "
                             "choose a profile without GPUs for a server without them")
        fields.update(asked)
        prof.apply_kind(fields, asked)
        if prof.chosen_kind(asked) == "whole" and (vfields.get("mig_profile") or vfields.get("gpu_share_mib")):
            # Voyager fills what a request leaves out from the profile it
            # names: a request cannot take back its MIG profile or fraction.
            what = "MIG devices" if vfields.get("mig_profile") else "a fraction of a shared GPU"
            raise ValueError(f"profile {vname!r} gives {what}: for whole GPUs choose a profile of whole GPUs "
                             "(or the default server), or its own kind of GPU")
        return fields, vname

    def hub_links(self):
        """JUPYTERHUB_PUBLIC_URL and JUPYTERHUB_PUBLIC_HUB_URL for the
        session's environment (the console's links through the hub), when
        hub_public_url is known."""
        base = (self.hub_public_url or "").rstrip("/")
        if not base:
            return {}
        server = getattr(self.server, "base_url", None) or url_path_join(self.user.url, url_escape_path(self.name or ""), "")
        return {"JUPYTERHUB_PUBLIC_URL": base + server.rstrip("/") + "/",
                "JUPYTERHUB_PUBLIC_HUB_URL": base + "/" + self.hub.base_url.strip("/") + "/"}

    async def session_request(self, client):
        """The body of POST /api/v1/sessions for this server."""
        fields, vname = await self.resolve(client)
        env = {k: v for k, v in self.get_env().items() if k not in self.drop_env}
        env.update(fields.get("env") or {})
        env.update(self.extra_env)
        env.update(self.hub_links())
        resources = {"gpus": fields["gpus"], "cpuMilli": fields["cpu_milli"], "memoryMiB": fields["memory_mib"]}
        if fields.get("gpu_model"):
            resources["gpuModel"] = fields["gpu_model"]
        if fields.get("mig_profile"):
            # gpus MIG devices of this profile instead of whole GPUs.
            resources["migProfile"] = fields["mig_profile"]
        if fields.get("gpu_share_mib"):
            # A fraction of one shared GPU (enforced by CUDA MPS on the node).
            resources["gpus"] = 1
            resources["gpuShareMiB"] = fields["gpu_share_mib"]
            if fields.get("gpu_compute_percent"):
                resources["gpuComputePercent"] = fields["gpu_compute_percent"]
        body = {
            "kind": "notebook",
            "name": server_label(self.name),
            "image": fields["image"],
            "command": ["/bin/sh", "-c", SINGLEUSER],
            "env": env,
            "resources": resources,
        }
        if vname:
            body["profile"] = vname
        limits = {k2: fields[k] for k, k2 in (("idle_timeout", "idleTimeout"), ("max_runtime", "maxRuntime")) if fields.get(k)}
        if limits:
            body["limits"] = limits
        return body

    # ---- progress: one log per spawn, replayed to every reader ----

    def _reset_progress(self):
        self._progress = []
        self._progress_done = False
        self._progress_changed = asyncio.Event()

    def _emit(self, event):
        if self._progress and self._progress[-1] == event:
            return
        self._progress.append(event)
        self._wake()

    def _finish_progress(self):
        self._progress_done = True
        self._wake()

    def _wake(self):
        changed, self._progress_changed = self._progress_changed, asyncio.Event()
        changed.set()

    async def progress(self):
        """This spawn's events from the first, then each new one, until the
        spawn succeeds or fails; every reader gets all of them."""
        i = 0
        while True:
            while i < len(self._progress):
                yield self._progress[i]
                i += 1
            if self._progress_done:
                return
            await self._progress_changed.wait()

    # ---- the session ----

    async def start(self):
        self._reset_progress()
        self._cancelled = False
        try:
            return await self._start()
        except SpawnError:
            raise
        except VoyagerError as e:
            raise self._spawn_error(e) from None
        except ValueError as e:
            raise SpawnError(f"Cannot start this server: {e}", 400) from None
        finally:
            self._finish_progress()

    async def _start(self):
        await self._read_auth_state_groups()
        client = self.client()
        if not self.idempotency_key:
            self.idempotency_key = str(uuid.uuid4())
        body = await self.session_request(client)
        # A refusal (bad profile, impossible request) raises here, at once,
        # with Voyager's reason.
        view = await client.create_session(body, self.idempotency_key)
        self.session_id = view["id"]
        self._image = view.get("image") or body["image"]
        self.log.info("Voyager session %s for %s", self.session_id, self._log_name)
        if self._cancelled:  # the user left while the session was being created
            await client.stop_session(self.session_id)
        status = await self._follow(client)
        return server_url(status)

    async def _follow(self, client):
        """Follows the event stream until the session runs; raises if it
        ends, or waits for a reason that waiting cannot fix."""
        outcome = {}

        def on_event(ev):
            self._emit(self._progress_event(ev))
            phase, reason = ev.get("phase"), ev.get("reason")
            if phase == "Pending" and reason not in HOPELESS:
                self._schedule_estimate(client, ev)
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
                st = view["status"]
                on_event({"phase": st["phase"], "reason": st.get("reason"), "message": st.get("message", ""),
                          "status": st, "terminal": st["phase"] not in LIVE})
        if "running" in outcome:
            return outcome["running"]
        if "hopeless" in outcome:
            ev = outcome["hopeless"]
            # Free the queue slot: the request can never be served as it is.
            await client.stop_session(self.session_id)
            raise SpawnError(f"Voyager cannot place this server: {status_words(ev)}", 409)
        raise SpawnError(await self._ended_words(client, outcome["ended"]), 500)

    async def _ended_words(self, client, ev):
        """Why a session ended before its server was ready, in words."""
        if self._cancelled:
            return "You left the queue. Start your server again whenever you like."
        st = ev.get("status") or {}
        code = st.get("exitCode")
        tail = ""
        if code is not None:
            try:
                tail = (await client.logs(self.session_id, tail=5)).strip()
            except VoyagerError as e:
                self.log.debug("read logs of %s: %s", self.session_id, e)
        if code == NO_SINGLEUSER_EXIT or NO_SINGLEUSER in tail:
            return (f"The image {getattr(self, '_image', '') or '(unknown)'} has no jupyterhub-singleuser command, "
                    "so it cannot run a JupyterHub server: choose another profile, or ask your administrator for "
                    "an image with JupyterHub installed (`make image` builds one from Debian's packages).")
        words = f"Your server stopped before it was ready: {status_words(ev)}"
        if tail:
            words += f". Its last log lines: {tail[-600:]}"
        return words

    def _spawn_error(self, e):
        """A VoyagerError as the user should read it."""
        if e.status == 0:
            return SpawnError(f"Voyager, which runs the servers, is not answering ({e.detail or e.title}). "
                              "Try again in a few minutes; tell your administrator if it lasts.", 503, e)
        if e.status == -1 or e.status in (401, 403):
            return SpawnError(f"Voyager refused the hub's credentials ({e}). This is for your administrator: "
                              "check VoyagerSpawner.voyager_private_key_file and VOYAGER_JWT_PUBLIC_KEYS.", 502, e)
        if e.status in (400, 404, 409, 422):
            return SpawnError(f"Voyager refused this server: {e.detail or e.title}", 400 if e.status == 404 else e.status, e)
        return SpawnError(f"Voyager failed ({e.status} {e.title}): {e.detail}", 502, e)

    def _schedule_estimate(self, client, ev):
        """Reads the waiting session's estimated start (GET /sessions/ID's
        estimate) and shows it on the pending page, once per event and
        never two at a time."""
        task = getattr(self, "_estimate_task", None)
        if task is not None and not task.done():
            return
        self._estimate_task = asyncio.ensure_future(self._emit_estimate(client, ev))

    async def _emit_estimate(self, client, ev):
        try:
            view = await client.get_session(self.session_id)
        except VoyagerError as e:
            self.log.debug("read the estimate of %s: %s", self.session_id, e)
            return
        est = view.get("estimate") or {}
        if (view.get("status") or {}).get("phase") != "Pending" or not est.get("message"):
            return
        # Only while the page still says it waits: never after a later
        # event (bound, running, ended) was shown.
        if self._progress_done or not self._progress or self._progress[-1] != self._progress_event(ev):
            return
        self._emit(self._progress_event(ev, estimate_words(est)))

    def _progress_event(self, ev, extra=""):
        """progress_event, with a "Leave the queue" button while the
        session waits in the queue, where the hub serves the cancel page
        (voyager_spawner.extra_handlers); extra follows the message."""
        out = progress_event(ev)
        if extra:
            out["message"] = out["message"].rstrip(". ") + ". " + extra
        if ev.get("phase") == "Pending" and handlers.registered:
            action = url_path_join(self.hub.base_url, CANCEL_PATH, self.user.escaped_name, url_escape_path(self.name or ""))
            out["html_message"] = (html.escape(out["message"]) +
                                   f' <form method="post" action="{html.escape(action)}" style="display:inline">'
                                   '<button type="submit" class="btn btn-xs btn-default">Leave the queue</button></form>')
        return out

    async def cancel(self):
        """Leaves Voyager's queue: cancels the session of this pending
        spawn, which then fails with "You left the queue"."""
        self._cancelled = True
        if self.session_id:
            await self.client().stop_session(self.session_id)

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


def estimate_words(est):
    """A queue estimate (the API's QueueEstimate) in words for the pending
    page."""
    msg = est.get("message", "")
    if est.get("at"):
        return f"Estimated start: {msg}."
    return f"Start time: {msg}."


def status_words(ev):
    """The plain reason of an event: the status's message, else the event's."""
    st = ev.get("status") or {}
    return st.get("message") or ev.get("message") or ev.get("reason") or ev.get("phase") or "no reason given"


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
