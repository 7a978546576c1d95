# Sourced by the images' build.sh: one way to make a notebook-user image
# from Debian's packages, so that every image builds, caches and is written
# the same way.
#
# debian_image NAME OUT TAG PACKAGES [-- MKIMAGE-ARGS...]
#   Unless OUT exists: debootstrap a minimal bookworm (DEBIAN_MIRROR, else
#   the machine's apt source), apt-get install PACKAGES (one string) inside
#   it, add the unprivileged user jovyan (uid 1000), run the caller's
#   image_extra ROOTFS function if it defines one, and write OUT, a
#   docker-archive tar of TAG (mkimage.py) running as 1000:1000 in
#   /home/jovyan, with MKIMAGE-ARGS added. Needs root (debootstrap, chroot).
#   IMAGE_CLEAN, if set, is removed inside the rootfs after the install.

debian_image() {
	local name=$1 out=$2 tag=$3 packages=$4
	shift 4
	[[ ${1:-} == -- ]] && shift
	local lib mirror work root
	lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
	mirror=${mirror:-http://deb.debian.org/debian}

	if [[ -s $out ]]; then
		echo "image archive $out exists; delete it to rebuild"
		return 0
	fi
	if [[ $(id -u) != 0 ]]; then
		echo "build.sh: needs root for debootstrap and chroot" >&2
		return 1
	fi
	command -v debootstrap >/dev/null || {
		apt-get update
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap
	}

	work=$(mktemp -d "${TMPDIR:-/tmp}/voyager-$name.XXXXXX")
	# shellcheck disable=SC2064 # the paths are fixed now
	trap "umount '$work/rootfs/proc' 2>/dev/null || true; rm -rf '$work'" EXIT
	root=$work/rootfs

	debootstrap --variant=minbase bookworm "$root" "$mirror"
	mount -t proc proc "$root/proc"
	chroot "$root" /bin/sh -ec "
		export DEBIAN_FRONTEND=noninteractive
		apt-get update
		apt-get install -y --no-install-recommends $packages
		apt-get clean
		rm -rf /var/lib/apt/lists/* ${IMAGE_CLEAN:-}
		useradd --uid 1000 --user-group --create-home --shell /bin/bash jovyan
	"
	umount "$root/proc"
	if declare -F image_extra >/dev/null; then
		image_extra "$root"
	fi

	mkdir -p "$(dirname "$out")"
	python3 "$lib/mkimage.py" --rootfs "$root" --tag "$tag" --user 1000:1000 \
		--workdir /home/jovyan --env HOME=/home/jovyan --env SHELL=/bin/bash "$@" --out "$out.tmp"
	mv "$out.tmp" "$out"
	echo "wrote $out ($tag)"
}
