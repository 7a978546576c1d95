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
cache=${VOYAGER_IMAGE_CACHE:-$HOME/.cache/voyager/images}
out=${1:-$cache/voyager.local-jupyter.tar}
tag=${VOYAGER_JUPYTER_IMAGE:-voyager.local/jupyter:latest}
mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
mirror=${mirror:-http://deb.debian.org/debian}

if [[ -s $out ]]; then
	echo "image archive $out exists; delete it to rebuild"
	exit 0
fi
if [[ $(id -u) != 0 ]]; then
	echo "build.sh: needs root for debootstrap and chroot" >&2
	exit 1
fi
command -v debootstrap >/dev/null || {
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap
}

work=$(mktemp -d "${TMPDIR:-/tmp}/voyager-jupyter.XXXXXX")
trap 'umount "$work/rootfs/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
root=$work/rootfs

debootstrap --variant=minbase bookworm "$root" "$mirror"
mount -t proc proc "$root/proc"
chroot "$root" /bin/sh -ec '
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	apt-get install -y --no-install-recommends \
		jupyterhub python3-jupyter-server python3-notebook jupyter-core \
		python3-ipykernel ca-certificates
	apt-get clean
	rm -rf /var/lib/apt/lists/*
	useradd --uid 1000 --user-group --create-home --shell /bin/bash jovyan
'
umount "$root/proc"

mkdir -p "$(dirname "$out")"
python3 "$here/../mkimage.py" --rootfs "$root" --tag "$tag" --user 1000:1000 \
	--workdir /home/jovyan --env HOME=/home/jovyan --env SHELL=/bin/bash --out "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out ($tag)"
