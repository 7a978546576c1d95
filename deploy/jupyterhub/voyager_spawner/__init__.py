"""JupyterHub spawner that runs single-user servers as Voyager sessions."""

from .spawner import VoyagerSpawner, VoyagerError

__all__ = ["VoyagerSpawner", "VoyagerError"]
