"""JupyterHub spawner that runs single-user servers as Voyager sessions.

Installed as the ``jupyterhub-voyagerspawner`` package, it registers the
``voyager`` entry point of ``jupyterhub.spawners``, so a hub selects it with
``c.JupyterHub.spawner_class = "voyager"``.
"""

from .client import VoyagerError
from .spawner import SpawnError, VoyagerSpawner

__all__ = ["VoyagerSpawner", "VoyagerError", "SpawnError"]
__version__ = "0.2.0"
