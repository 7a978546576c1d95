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
# shellcheck source=../debian-image.sh
. "$here/../debian-image.sh"
cache=${VOYAGER_IMAGE_CACHE:-$HOME/.cache/voyager/images}
# The host keys are made at the session's start, by voyager-sshd.
IMAGE_CLEAN="/etc/ssh/ssh_host_*"
image_extra() { install -m 0755 "$here/voyager-sshd" "$1/usr/local/bin/voyager-sshd"; }
debian_image sshd "${1:-$cache/voyager.local-sshd.tar}" "${VOYAGER_SSHD_IMAGE:-voyager.local/sshd:latest}" \
	"openssh-server libnss-wrapper bash git ca-certificates procps" -- --cmd /usr/local/bin/voyager-sshd
