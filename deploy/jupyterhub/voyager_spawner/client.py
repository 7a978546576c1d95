"""A small asynchronous client of Voyager's HTTP API, on tornado (which
JupyterHub already depends on). It speaks as a service acting on behalf of
one user: every request carries the service token and the user's name."""

import asyncio
import json
import socket
import ssl
from urllib.parse import quote, urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

ON_BEHALF_OF = "X-Voyager-On-Behalf-Of"


class VoyagerError(Exception):
    """A refusal or failure from Voyager, with its plain-words reason.

    status is the HTTP status (0 when Voyager could not be reached, -1 when
    the hub has no usable credentials: its signing key cannot be read), title
    and detail come from the problem+json body.
    """

    def __init__(self, status, title, detail=""):
        self.status, self.title, self.detail = status, title, detail
        super().__init__(f"{title}: {detail}" if detail else title)


class Client:
    """Calls /api/v1 of Voyager at url as user. token is a function that
    returns the bearer token to send: asked again for every request, so a
    minted token is replaced before it expires."""

    def __init__(self, url, token, user, timeout=30):
        self.url = url.rstrip("/") + "/api/v1"
        self.token = token
        self.user = user
        self.timeout = timeout
        self.http = AsyncHTTPClient()

    def _headers(self, extra=None):
        h = {"Authorization": f"Bearer {self.token()}", ON_BEHALF_OF: self.user, "Accept": "application/json"}
        h.update(extra or {})
        return h

    async def request(self, method, path, body=None, headers=None, raw=False):
        """Sends one request and returns the decoded JSON answer (the text
        when raw)."""
        data = None if body is None else json.dumps(body)
        try:
            hdrs = self._headers(headers)
        except ValueError as e:  # the signing key cannot be read
            raise VoyagerError(-1, "No Voyager credentials", str(e)) from None
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        req = HTTPRequest(self.url + path, method=method, body=data, headers=hdrs,
                          request_timeout=self.timeout, allow_nonstandard_methods=True)
        try:
            resp = await self.http.fetch(req)
        except HTTPClientError as e:
            raise problem(e) from None
        except OSError as e:
            raise VoyagerError(0, "Voyager is unreachable", unreachable_words(urlsplit(self.url).netloc, e)) from None
        if raw:
            return resp.body.decode("utf-8", "replace")
        return json.loads(resp.body or b"null")

    async def create_session(self, body, idempotency_key):
        return await self.request("POST", "/sessions", body, {"Idempotency-Key": idempotency_key})

    async def get_session(self, sid):
        return await self.request("GET", "/sessions/" + quote(sid, safe=""))

    async def stop_session(self, sid):
        return await self.request("POST", "/sessions/" + quote(sid, safe="") + "/stop")

    async def logs(self, sid, tail=5):
        return await self.request("GET", "/sessions/" + quote(sid, safe="") + f"/logs?tail={int(tail)}", raw=True)

    async def profiles(self):
        return await self.request("GET", "/profiles")

    async def profile(self, name):
        return await self.request("GET", "/profiles/" + quote(name, safe=""))

    async def nodes(self):
        """The nodes with their devices, as the user may see them: her own
        holdings named, others' "(another user)"."""
        return await self.request("GET", "/nodes?devices=true")

    async def events(self, sid, on_event, last_event_id=None, timeout=None):
        """Streams the session's status events (Server-Sent Events),
        calling on_event(dict) for each, until the stream ends or on_event returns
        True, and returns the id of the last event, to resume from.

        It speaks HTTP/1.1 over asyncio streams rather than through
        tornado's client, so that it can hang up a stream the server keeps
        open (a running session's) cleanly."""
        u = urlsplit(self.url + "/sessions/" + quote(sid, safe="") + "/events")
        port = u.port or (443 if u.scheme == "https" else 80)
        try:
            hdrs = self._headers({"Accept": "text/event-stream", "Host": u.netloc, "Connection": "close"})
        except ValueError as e:
            raise VoyagerError(-1, "No Voyager credentials", str(e)) from None
        if last_event_id:
            hdrs["Last-Event-ID"] = str(last_event_id)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(u.hostname, port, ssl=(u.scheme == "https") or None), self.timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise VoyagerError(0, "Voyager is unreachable", unreachable_words(u.netloc, e)) from None
        last = {"id": last_event_id}
        try:
            target = u.path + (("?" + u.query) if u.query else "")
            writer.write((f"GET {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode())
            await writer.drain()
            status_line = (await reader.readline()).decode("latin-1")
            code = int(status_line.split()[1]) if len(status_line.split()) > 1 else 0
            headers = {}
            while True:
                line = (await reader.readline()).decode("latin-1").strip()
                if not line:
                    break
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            chunked = "chunked" in headers.get("transfer-encoding", "")
            if code != 200:
                body = await _read_body(reader, chunked)
                raise problem_from(code, body)
            buf = b""
            async for data in _body_chunks(reader, chunked):
                buf += data
                while b"\n\n" in buf:
                    block, buf = buf.split(b"\n\n", 1)
                    fields = {}
                    for line in block.decode("utf-8", "replace").splitlines():
                        if line.startswith(":") or ":" not in line:
                            continue
                        k, v = line.split(":", 1)
                        fields[k] = fields.get(k, "") + v.lstrip(" ")
                    if "id" in fields:
                        last["id"] = fields["id"]
                    # Only status events drive the spawn; warnings
                    # (event: warning, warning-withdrawn) are not states.
                    if fields.get("event", "status") != "status":
                        continue
                    if fields.get("data") and on_event(json.loads(fields["data"])):
                        return last["id"]
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # a broken stream: the caller resumes from the last id
        finally:
            writer.close()
        return last["id"]


async def _body_chunks(reader, chunked):
    """Yields the body's data as it arrives."""
    if not chunked:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)  # CRLF after each chunk


async def _read_body(reader, chunked):
    out = b""
    async for data in _body_chunks(reader, chunked):
        out += data
        if len(out) > 1 << 20:
            break
    return out


def unreachable_words(where, e):
    """Why Voyager's API at where (host:port) could not be reached, in
    words rather than an errno: what the hub's administrator checks."""
    if isinstance(e, socket.gaierror):
        why = "its host name does not resolve"
    elif isinstance(e, ConnectionRefusedError):
        why = "nothing accepts connections there (is voyager api running?)"
    elif isinstance(e, (TimeoutError, asyncio.TimeoutError, socket.timeout)):
        why = "it did not answer in time"
    elif isinstance(e, ConnectionResetError):
        why = "it closed the connection"
    elif isinstance(e, ssl.SSLError):
        why = f"the TLS handshake failed ({getattr(e, 'reason', None) or 'certificate or protocol'})"
    else:
        why = getattr(e, "strerror", None) or e.__class__.__name__
        why = why[0].lower() + why[1:] if why else "it could not be reached"
    return f"the hub could not reach Voyager's API at {where}: {why}"


def problem_from(code, body):
    """A VoyagerError from a status code and a problem+json body."""
    title, detail = f"HTTP {code}", ""
    try:
        p = json.loads(body)
        title = p.get("title") or title
        detail = p.get("detail") or ""
        errs = p.get("errors") or []
        if errs:
            detail = "; ".join(f"{x.get('field')}: {x.get('message')}" for x in errs) or detail
    except ValueError:
        detail = body.decode("utf-8", "replace")[:500]
    return VoyagerError(code, title, detail)


def problem(e):
    """Turns a tornado HTTP error into a VoyagerError with the problem's words."""
    body = getattr(e.response, "body", None) if e.response is not None else None
    return problem_from(e.code, body or b"")
