#!/usr/bin/env python3
"""Write a root filesystem directory as a single-layer docker-archive tar.

containerd imports the result (`ctr -n voyager images import OUT.tar`, or
the Go client's Import), so Voyager's images can be made from Debian's
packages on machines that reach no registry. Standard library only.

Usage: mkimage.py --rootfs DIR --tag NAME:TAG --out OUT.tar
                  [--user UID:GID] [--workdir DIR] [--env K=V ...] [--cmd ARG ...]
"""
import argparse
import hashlib
import io
import json
import os
import tarfile
import tempfile


def layer_from_rootfs(rootfs, path):
    """Tar rootfs into path (numeric owners kept) and return its sha256."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(os.listdir(rootfs)):
            tar.add(os.path.join(rootfs, entry), arcname=entry, recursive=True)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rootfs", required=True)
    p.add_argument("--tag", required=True, help="image reference, e.g. voyager.local/jupyter:latest")
    p.add_argument("--out", required=True)
    p.add_argument("--user", default="")
    p.add_argument("--workdir", default="/")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--cmd", nargs="*", default=[])
    a = p.parse_args()

    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + a.env
    with tempfile.TemporaryDirectory() as tmp:
        layer = os.path.join(tmp, "layer.tar")
        diff_id = layer_from_rootfs(a.rootfs, layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"User": a.user, "Env": env, "WorkingDir": a.workdir, "Cmd": a.cmd or None},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
            "history": [{"created_by": "voyager deploy/images/mkimage.py"}],
        }
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
        manifest = [{"Config": config_name, "RepoTags": [a.tag], "Layers": [diff_id + "/layer.tar"]}]
        with tarfile.open(a.out, "w") as tar:
            add_bytes(tar, config_name, config_bytes)
            tar.add(layer, arcname=diff_id + "/layer.tar")
            add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
    print(f"{a.out}: {a.tag}, layer sha256:{diff_id[:12]}")


if __name__ == "__main__":
    main()
