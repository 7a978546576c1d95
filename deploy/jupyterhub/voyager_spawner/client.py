"""A small asynchronous client of Voyager's HTTP API, on tornado (which
JupyterHub already depends on). It speaks as a service acting on behalf of
one user: every request carries the service token and the user's name."""

import json
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

ON_BEHALF_OF = "X-Voyager-On-Behalf-Of"


class VoyagerError(Exception):
    """A refusal or failure from Voyager, with its plain-words reason.

    status is the HTTP status (0 when Voyager could not be reached), title
    and detail come from the problem+json body.
    """

    def __init__(self, status, title, detail=""):
        self.status, self.title, self.detail = status, title, detail
        super().__init__(f"{title}: {detail}" if detail else title)


class Client:
    """Calls /api/v1 of Voyager at url with token, as user."""

    def __init__(self, url, token, user, timeout=30):
        self.url = url.rstrip("/") + "/api/v1"
        self.token = token
        self.user = user
        self.timeout = timeout
        self.http = AsyncHTTPClient()

    def _headers(self, extra=None):
        h = {"Authorization": f"Bearer {self.token}", ON_BEHALF_OF: self.user, "Accept": "application/json"}
        h.update(extra or {})
        return h

    async def request(self, method, path, body=None, headers=None):
        """Sends one request and returns the decoded JSON answer."""
        data = None if body is None else json.dumps(body)
        hdrs = self._headers(headers)
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        req = HTTPRequest(self.url + path, method=method, body=data, headers=hdrs,
                          request_timeout=self.timeout, allow_nonstandard_methods=True)
        try:
            resp = await self.http.fetch(req)
        except HTTPClientError as e:
            raise problem(e) from None
        except OSError as e:
            raise VoyagerError(0, "Voyager is unreachable", f"{self.url}: {e}") from None
        return json.loads(resp.body or b"null")

    async def create_session(self, body, idempotency_key):
        return await self.request("POST", "/sessions", body, {"Idempotency-Key": idempotency_key})

    async def get_session(self, sid):
        return await self.request("GET", "/sessions/" + quote(sid, safe=""))

    async def stop_session(self, sid):
        return await self.request("POST", "/sessions/" + quote(sid, safe="") + "/stop")

    async def profiles(self):
        return await self.request("GET", "/profiles")

    async def events(self, sid, on_event, last_event_id=None, timeout=None):
        """Streams the session's events (Server-Sent Events), calling
        on_event(dict) for each, until the stream ends. Returns the id of
        the last event, to resume from."""
        last = {"id": last_event_id}
        buf = {"data": b""}

        def chunk(data):
            buf["data"] += data
            while b"\n\n" in buf["data"]:
                block, buf["data"] = buf["data"].split(b"\n\n", 1)
                fields = {}
                for line in block.decode("utf-8", "replace").splitlines():
                    if line.startswith(":") or ":" not in line:
                        continue
                    k, v = line.split(":", 1)
                    fields[k] = fields.get(k, "") + v.lstrip(" ")
                if "id" in fields:
                    last["id"] = fields["id"]
                if fields.get("data"):
                    on_event(json.loads(fields["data"]))

        hdrs = self._headers({"Accept": "text/event-stream"})
        if last_event_id:
            hdrs["Last-Event-ID"] = str(last_event_id)
        req = HTTPRequest(self.url + "/sessions/" + quote(sid, safe="") + "/events", headers=hdrs,
                          streaming_callback=chunk, request_timeout=timeout or 24 * 3600)
        try:
            await self.http.fetch(req)
        except HTTPClientError as e:
            if e.code == 599:  # timeout or connection closed mid-stream
                return last["id"]
            raise problem(e) from None
        except OSError as e:
            raise VoyagerError(0, "Voyager is unreachable", str(e)) from None
        return last["id"]


def problem(e):
    """Turns an HTTP error into a VoyagerError carrying the problem's words."""
    title, detail = f"HTTP {e.code}", ""
    body = getattr(e.response, "body", None) if e.response is not None else None
    if body:
        try:
            p = json.loads(body)
            title = p.get("title") or title
            detail = p.get("detail") or ""
            errs = p.get("errors") or []
            if errs:
                detail = "; ".join(f"{x.get('field')}: {x.get('message')}" for x in errs) or detail
        except ValueError:
            detail = body.decode("utf-8", "replace")[:500]
    return VoyagerError(e.code, title, detail)
