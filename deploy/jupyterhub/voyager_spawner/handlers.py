"""A hub page that lets a queued user leave Voyager's queue.

JupyterHub 3.0 will not stop a pending spawn ("pending spawn, please
wait"). With these handlers registered, the pending page's queue message
carries a "Leave the queue" button that posts to
/hub/voyager/cancel/<user>/<server>: the spawner cancels the queued
session, and the spawn fails at once with "You left the queue".

    import voyager_spawner
    c.JupyterHub.extra_handlers = voyager_spawner.extra_handlers()
"""

from jupyterhub.handlers import BaseHandler
from jupyterhub.scopes import needs_scope
from jupyterhub.utils import url_path_join
from tornado import web

# The hub path of the cancel page, under the hub's prefix.
CANCEL_PATH = "voyager/cancel"

# Set once extra_handlers() has been called in this process (the hub's
# configuration): the spawner offers the button only then.
registered = False


class CancelHandler(BaseHandler):
    """POST /hub/voyager/cancel/<user>/<server>: leave the queue."""

    @web.authenticated
    @needs_scope("servers")
    async def post(self, user_name, server_name=""):
        user = self.find_user(user_name)
        if user is None or server_name not in user.spawners:
            raise web.HTTPError(404, f"{user_name} has no server {server_name!r}")
        spawner = user.spawners[server_name]
        cancel = getattr(spawner, "cancel", None)
        if cancel is None or spawner.pending != "spawn":
            raise web.HTTPError(409, f"{spawner._log_name} is not waiting to start: nothing to cancel")
        await cancel()
        self.redirect(url_path_join(self.hub.base_url, "spawn-pending", user.escaped_name, server_name))


def extra_handlers():
    """The handlers for c.JupyterHub.extra_handlers."""
    global registered
    registered = True
    return [(rf"/{CANCEL_PATH}/([^/]+)/?([^/]*)", CancelHandler)]
