#!/usr/bin/env bash
# Installs what `make test` needs from Debian, only what is missing (make
# test runs it first, and CI runs make test). As root it apt-get installs
# the missing packages; otherwise it prints one line naming them and fails.
#
# containerd and runc run the agent's real containers; etcd-server and
# etcd-client are an external etcd and etcdctl to test against; python3-jwt
# (with python3-cryptography for RS256/ES256) mints tokens independently of
# the API's own JWT library; busybox-static is the binary the runtime and
# agent tests build their container image from (no registry is reachable);
# jupyterhub is the real hub the spawner is tested under (python3-venv,
# python3-pip and python3-setuptools install the spawner as its README
# says: a venv that sees the system's packages, pip without PyPI); debootstrap builds
# the notebook image from Debian's packages (deploy/images/jupyter/build.sh,
# which also needs node and npm for JupyterLab's front end and installs
# Debian's nodejs and npm itself where npm is missing);
# chromium runs the web console's browser tests; containernetworking-plugins,
# iptables and iproute2 give each session its own network (docs/networking.md);
# bash-completion and zsh load the CLI's completion scripts; gcc and
# libc6-dev build the race detector's cgo parts; git stamps the version.
# openssh-client is the ssh and scp that `voyager ssh` is tested under as a
# ProxyCommand.
set -euo pipefail

packages=(containerd runc etcd-client etcd-server python3-jwt python3-cryptography busybox-static
	jupyterhub debootstrap chromium bash-completion zsh gcc libc6-dev git
	containernetworking-plugins iptables iproute2 python3-venv python3-pip python3-setuptools openssh-client)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done
if ((${#missing[@]} > 0)); then
	if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
		echo "test-setup: the tests need ${missing[*]}; install them as root: apt-get install -y --no-install-recommends ${missing[*]}" >&2
		exit 1
	fi
	echo "test-setup: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "test-setup: $(go version | cut -d' ' -f3-4); containerd $(containerd --version | cut -d' ' -f3); $(runc --version | sed -n 1p); etcd $(etcd --version | sed -n 's/^etcd Version: //p'); jupyterhub $(jupyterhub --version)"
