# An example JupyterHub configuration that spawns every single-user server
# as a Voyager notebook session. Install the spawner and make a key pair
# first (README.md, "Install" and "Configure"):
#
#   /usr/bin/python3 -m venv --system-site-packages /opt/jupyterhub
#   /opt/jupyterhub/bin/pip install --no-build-isolation ./deploy/jupyterhub
#   /opt/jupyterhub/bin/python -m voyager_spawner keygen /etc/jupyterhub/voyager
#   # Voyager's API: VOYAGER_JWT_PUBLIC_KEYS=<a copy of /etc/jupyterhub/voyager.pub>
#   /opt/jupyterhub/bin/python -m jupyterhub -f deploy/jupyterhub/jupyterhub_config.py
#
# `c` is provided by JupyterHub when it loads this file.
# ruff: noqa: F821

import voyager_spawner

c.JupyterHub.spawner_class = "voyager"
# A "Leave the queue" button on the pending page of a queued spawn.
c.JupyterHub.extra_handlers = voyager_spawner.extra_handlers()

c.VoyagerSpawner.voyager_url = "http://voyager-api:7070"
# The spawner signs its own short-lived service tokens with this key.
c.VoyagerSpawner.voyager_private_key_file = "/etc/jupyterhub/voyager.key"

# Single-user servers run on GPU nodes: the hub (and its proxy) must listen
# where those nodes can reach it, and reach them in turn.
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = ""  # set to this machine's address as the nodes see it

# Servers are Voyager sessions: they outlive a hub restart, and the
# restarted hub finds them again. Without this, stopping the hub would
# stop every user's server.
c.JupyterHub.cleanup_servers = False

# What a server gets when its profile does not say (README.md, "The merge
# rule"); the form offers Voyager's profiles unless profile_list is set.
c.VoyagerSpawner.image = "voyager.local/jupyter:latest"
c.VoyagerSpawner.gpus = 1
c.VoyagerSpawner.cpu_milli = 4000
c.VoyagerSpawner.memory_mib = 16384
c.VoyagerSpawner.idle_timeout = "2h"

# A session may wait in Voyager's queue: give it time, and let the spawn
# page show its place in line.
c.Spawner.start_timeout = 3600
c.Spawner.http_timeout = 120
