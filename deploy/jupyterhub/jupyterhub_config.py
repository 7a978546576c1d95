# An example JupyterHub configuration that spawns every single-user server
# as a Voyager notebook session. Put voyager_spawner on the hub's Python path
# (this directory), and give the hub a Voyager token with the service role:
#
#   export VOYAGER_URL=http://voyager-api:7070
#   export VOYAGER_TOKEN=$(voyager token --sub jupyterhub --role service)
#   jupyterhub -f deploy/jupyterhub/jupyterhub_config.py
#
# `c` is provided by JupyterHub when it loads this file.
# ruff: noqa: F821

c.JupyterHub.spawner_class = "voyager_spawner.VoyagerSpawner"

# Single-user servers run on GPU nodes: the hub (and its proxy) must listen
# where those nodes can reach it, and reach them in turn.
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_connect_ip = ""  # set to this machine's address as the nodes see it

c.VoyagerSpawner.image = "voyager.local/jupyter:latest"
c.VoyagerSpawner.gpus = 1
c.VoyagerSpawner.cpu_milli = 4000
c.VoyagerSpawner.memory_mib = 16384
c.VoyagerSpawner.idle_timeout = "2h"

# A session may wait in Voyager's queue: give it time, and let the spawn
# page show its place in line.
c.Spawner.start_timeout = 3600
c.Spawner.http_timeout = 120
