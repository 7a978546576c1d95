"""JupyterHub spawner that runs single-user servers as Voyager sessions.

Installed as the ``jupyterhub-voyagerspawner`` package, it registers the
``voyager`` entry point of ``jupyterhub.spawners``, so a hub selects it with
``c.JupyterHub.spawner_class = "voyager"``.
"""

from .client import VoyagerError
from .spawner import SpawnError, VoyagerSpawner

__all__ = ["VoyagerSpawner", "VoyagerError", "SpawnError", "extra_handlers"]


def extra_handlers():
    """The hub pages of the spawner, for c.JupyterHub.extra_handlers: the
    "Leave the queue" button of a queued spawn (handlers.py)."""
    from .handlers import extra_handlers as handlers

    return handlers()
__version__ = "0.2.0"
