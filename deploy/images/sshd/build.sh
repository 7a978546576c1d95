#!/usr/bin/env bash
# Builds voyager.local/sshd:latest, the image recipe for a shell and VS Code
# Remote-SSH into a session (docs/ssh.md): Debian's openssh-server,
# libnss-wrapper, bash and git on a minimal bookworm, with
# /usr/local/bin/voyager-sshd (sshd as the session's own user on its
# loopback) as its command. Add the same packages and script to any image
# to make it reachable with voyager ssh.
#
# Usage: deploy/images/sshd/build.sh [OUT.tar]
#   OUT defaults to ${VOYAGER_IMAGE_CACHE:-$HOME/.cache/voyager/images}/voyager.local-sshd.tar
#   and is reused when it exists (delete it to rebuild). Needs root
#   (debootstrap, chroot). About 2 minutes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${VOYAGER_IMAGE_CACHE:-$HOME/.cache/voyager/images}
out=${1:-$cache/voyager.local-sshd.tar}
tag=${VOYAGER_SSHD_IMAGE:-voyager.local/sshd:latest}
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

work=$(mktemp -d "${TMPDIR:-/tmp}/voyager-sshd.XXXXXX")
trap 'umount "$work/rootfs/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
root=$work/rootfs

debootstrap --variant=minbase bookworm "$root" "$mirror"
mount -t proc proc "$root/proc"
chroot "$root" /bin/sh -ec '
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	apt-get install -y --no-install-recommends openssh-server libnss-wrapper bash git ca-certificates procps
	apt-get clean
	rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*
	useradd --uid 1000 --user-group --create-home --shell /bin/bash jovyan
'
umount "$root/proc"
install -m 0755 "$here/voyager-sshd" "$root/usr/local/bin/voyager-sshd"

mkdir -p "$(dirname "$out")"
python3 "$here/../mkimage.py" --rootfs "$root" --tag "$tag" --user 1000:1000 \
	--workdir /home/jovyan --env HOME=/home/jovyan --env SHELL=/bin/bash --cmd /usr/local/bin/voyager-sshd --out "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out ($tag)"
