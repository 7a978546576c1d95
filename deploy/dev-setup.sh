#!/usr/bin/env bash
# Prepares this machine for `voyager dev` to run real sessions: containerd
# and runc run the containers, busybox-static is what voyager dev builds its
# default session image from (no registry needed), and
# containernetworking-plugins, iptables and iproute2 give each session its
# own network (docs/networking.md). It installs only what is
# missing, with apt-get, and only as root; otherwise it says what to do.
# voyager dev itself starts a private containerd under its data dir when none
# is running, and imports the image (VOYAGER_AGENT_IMAGE) on first start.
set -euo pipefail

packages=(containerd runc busybox-static containernetworking-plugins iptables iproute2)
missing=()
for p in "${packages[@]}"; do
	if ! dpkg -s "$p" >/dev/null 2>&1; then
		missing+=("$p")
	fi
done
if ((${#missing[@]} == 0)); then
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "dev-setup: voyager dev needs ${missing[*]} to run sessions; as root: apt-get install -y ${missing[*]}" >&2
	echo "dev-setup: going on without them: voyager dev will run, but without a node agent" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "dev-setup: no apt-get here; install ${missing[*]} yourself (voyager dev runs without an agent meanwhile)" >&2
	exit 0
fi
echo "dev-setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y --no-install-recommends "${missing[@]}"
