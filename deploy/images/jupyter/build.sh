#!/usr/bin/env bash
# Builds voyager.local/jupyter:latest, a notebook image made from Debian's
# packages and the npm registry (no container registry, no PyPI):
# debootstrap a minimal bookworm, install JupyterHub's single-user server,
# Jupyter Server, jupyterlab_server and ipykernel into it, add JupyterLab's
# front end (lab/: the @jupyterlab 3.6 packages from the npm registry,
# pinned by lab/package-lock.json, bundled by webpack on this machine) with
# voyager_lab, the server extension that serves it at /lab, add the
# unprivileged user jovyan (uid 1000), and write a docker-archive tar that
# containerd imports (voyager image load, which `make image` runs next).
# Under voyager.local/ it is never pulled from a registry: absent, a session
# naming it fails at once, saying to run make image.
#
# Usage: deploy/images/jupyter/build.sh [OUT.tar]
#   OUT defaults to ${VOYAGER_IMAGE_CACHE:-$HOME/.cache/voyager/images}/voyager.local-jupyterlab.tar
#   and is reused when it exists (delete it to rebuild). Needs root
#   (debootstrap, chroot) and node with npm (installed from Debian when
#   missing). About 10 minutes on a loaded 2-core machine (webpack takes
#   most of it; npm's cache makes a rebuild's install quick) and 520 MB.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../debian-image.sh
. "$here/../debian-image.sh"
cache=${VOYAGER_IMAGE_CACHE:-$HOME/.cache/voyager/images}

# lab_frontend DIR: bundles JupyterLab's front end from lab/ into DIR/build
# (static/, schemas/, themes/).
lab_frontend() {
	local dir=$1
	if ! command -v npm >/dev/null; then
		apt-get update
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm
	fi
	mkdir -p "$dir"
	cp "$here/lab/package.json" "$here/lab/package-lock.json" "$here/lab/webpack.config.js" "$here/lab/index.js" "$dir/"
	# Exactly the lock file's packages, with their integrity checked; no
	# install scripts run.
	(cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
	(cd "$dir" && NODE_OPTIONS=${NODE_OPTIONS:---max-old-space-size=4096} node_modules/.bin/webpack --config webpack.config.js --no-stats)
	test -s "$dir/build/static/main.js"
}

# image_extra ROOTFS: the front end and voyager_lab into the image.
image_extra() {
	local root=$1 share=$1/usr/share/voyager-lab
	lab_frontend "$(dirname "$root")/lab"
	local build
	build=$(dirname "$root")/lab/build
	mkdir -p "$share" "$root/etc/jupyter/jupyter_server_config.d"
	cp -r "$build/static" "$build/schemas" "$build/themes" "$here/lab/templates" "$here/lab/settings" "$here/lab/package.json" "$share/"
	cp -r "$here/lab/voyager_lab" "$root/usr/lib/python3/dist-packages/"
	install -m 0644 "$here/lab/voyager_lab.json" "$root/etc/jupyter/jupyter_server_config.d/voyager_lab.json"
	install -m 0755 "$here/lab/jupyter-lab" "$root/usr/local/bin/jupyter-lab"
	chroot "$root" python3 -m compileall -q /usr/lib/python3/dist-packages/voyager_lab
}

# Debian's documentation and translations are not read inside a session.
IMAGE_CLEAN="/usr/share/doc/* /usr/share/man/* /usr/share/info/*"
# JupyterHub 3.0's single-user server opens /tree/ (the classic Notebook's
# page, which Jupyter Server lacks) unless JUPYTERHUB_DEFAULT_URL says
# otherwise, and it reads no jupyter_server_config: the image says /lab. A
# hub's own Spawner.default_url, set, comes in the session's environment,
# which wins over the image's.
debian_image jupyter "${1:-$cache/voyager.local-jupyterlab.tar}" "${VOYAGER_JUPYTER_IMAGE:-voyager.local/jupyter:latest}" \
	"jupyterhub python3-jupyter-server python3-jupyterlab-server jupyter-core python3-ipykernel python3-terminado libjs-mathjax ca-certificates" \
	-- --env JUPYTERHUB_DEFAULT_URL=/lab
