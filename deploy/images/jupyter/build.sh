#!/usr/bin/env bash
# Builds voyager.local/jupyter:latest, a notebook image made only from Debian's
# packages (no registry, no PyPI): debootstrap a minimal bookworm, install
# JupyterHub's single-user server and Jupyter Server into it, add the
# unprivileged user jovyan (uid 1000), and write a docker-archive tar that
# containerd imports (voyager image load, which `make image` runs next).
# Under voyager.local/ it is never pulled from a registry: absent, a session
# naming it fails at once, saying to run make image.
#
# Usage: deploy/images/jupyter/build.sh [OUT.tar]
#   OUT defaults to ${VOYAGER_IMAGE_CACHE:-$HOME/.cache/voyager/images}/voyager.local-jupyter.tar
#   and is reused when it exists (delete it to rebuild). Needs root
#   (debootstrap, chroot). About 2 minutes and 800 MB.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../debian-image.sh
. "$here/../debian-image.sh"
cache=${VOYAGER_IMAGE_CACHE:-$HOME/.cache/voyager/images}
debian_image jupyter "${1:-$cache/voyager.local-jupyter.tar}" "${VOYAGER_JUPYTER_IMAGE:-voyager.local/jupyter:latest}" \
	"jupyterhub python3-jupyter-server python3-notebook jupyter-core python3-ipykernel ca-certificates"
