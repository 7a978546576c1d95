#!/usr/bin/env bash
# gpu-check.sh: checks Voyager on a machine with real NVIDIA GPUs, end to
# end, as root. It runs `voyager dev` (embedded etcd, placer, agent on a
# private containerd, API) and checks that:
#   1. the agent's NVML inventory matches nvidia-smi (UUID, model, memory,
#      PCI bus id, compute capability);
#   2. a GPU that no CDI spec defines is offered unhealthy, saying why;
#   3. with a CDI spec, a batch session with one GPU sees exactly that GPU
#      (nvidia-smi in the container) and computes on it (vadd.cu, built with
#      nvcc where nvcc is installed);
#   4. a session without GPUs has no GPU device node and cannot make one.
# It prints PASS or FAIL for each and exits with the number of failures.
#
# Where nvidia-ctk is not installed the spec it uses is its own, in its work
# directory (never /etc/cdi): the GPU's device node, the control and UVM
# nodes, the driver's libraries and nvidia-smi, and the host's glibc, which
# the busybox image of `voyager dev` lacks. It changes nothing else on the
# machine but /bin/busybox, which it installs from GPUCHECK_BIN if absent
# (voyager dev builds its image from it).
#
# GPUCHECK_BIN: a directory with voyager, containerd,
#   containerd-shim-runc-v2, runc and busybox (each may be NAME.xz);
#   default: what PATH finds.
# GPUCHECK_WORK: work directory (default /tmp/voyager-gpu-check); dev's log
#   and the inventory are left there.
set -u
here=$(cd "$(dirname "$0")" && pwd)
work=${GPUCHECK_WORK:-/tmp/voyager-gpu-check}
rm -rf "$work" && mkdir -p "$work/bin" "$work/tools" "$work/cdi"
fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
section() { echo; echo "=== $* ($(date -u +%T))"; }
if [[ $(id -u) -ne 0 ]]; then
	echo "gpu-check: run as root (containerd and runc need it)" >&2
	exit 1
fi
if ! command -v nvidia-smi >/dev/null; then
	echo "gpu-check: no nvidia-smi: this machine has no NVIDIA driver to check" >&2
	exit 1
fi
if [[ -n ${GPUCHECK_BIN:-} ]]; then
	for f in voyager containerd containerd-shim-runc-v2 runc busybox; do
		if [[ -e $GPUCHECK_BIN/$f.xz ]]; then
			python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$GPUCHECK_BIN/$f.xz" "$work/bin/$f"
		else
			cp "$GPUCHECK_BIN/$f" "$work/bin/$f"
		fi
		chmod +x "$work/bin/$f"
	done
	export PATH=$work/bin:$PATH
	[[ -e /bin/busybox ]] || cp "$work/bin/busybox" /bin/busybox
fi

section machine
uname -r
nvidia-smi -L
nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,compute_cap,mig.mode.current --format=csv | tee "$work/nvidia-smi.csv"
ls -l /dev/nvidia*

section a CUDA program on the machine itself
if command -v nvcc >/dev/null && timeout 180 nvcc -O2 -o "$work/tools/vadd" "$here/vadd.cu"; then
	"$work/tools/vadd" && pass "vadd on the machine" || fail "vadd on the machine"
else
	echo "no nvcc: the sessions below run nvidia-smi only"
fi

# Activity every second, so that a 10-second busy session is sampled.
export VOYAGER_DATA_DIR=$work/data VOYAGER_AGENT_NETWORK=host VOYAGER_AGENT_ACTIVITY_EVERY=1s
dev_pid=
start_dev() {
	voyager dev >>"$work/dev.log" 2>&1 &
	dev_pid=$!
	for _ in $(seq 1 120); do
		curl -sf http://127.0.0.1:7070/readyz >/dev/null && break
		sleep 0.5
	done
	export VOYAGER_TOKEN
	VOYAGER_TOKEN=$(voyager token)
	for _ in $(seq 1 60); do
		voyager node list -o json >"$work/nodes.json" 2>/dev/null && grep -q '"name"' "$work/nodes.json" && break
		sleep 0.5
	done
}
stop_dev() {
	kill -INT "$dev_pid" && wait "$dev_pid"
}
node_key() { # the node's inventory as the agent wrote it to etcd
	python3 - "$@" <<'PY'
import base64, json, urllib.request
b = lambda s: base64.b64encode(s.encode()).decode()
req = urllib.request.Request("http://127.0.0.1:23790/v3/kv/range", data=json.dumps({"key": b("/voyager/nodes/"), "range_end": b("/voyager/nodes0")}).encode())
for kv in json.load(urllib.request.urlopen(req, timeout=5)).get("kvs", []):
    print(json.dumps(json.loads(base64.b64decode(kv["value"]))))
PY
}

section voyager dev, its own CDI spec directory still empty
VOYAGER_AGENT_CDI_SPEC_DIRS=/etc/cdi,/var/run/cdi,$work/cdi start_dev
voyager node list -o wide
python3 -c 'import json,sys; [print("problem:", p) for n in json.load(open(sys.argv[1])) for p in n.get("problems") or []]' "$work/nodes.json"
node_key >"$work/node-before.json"
if python3 - "$work/node-before.json" <<'PY'
import json, sys
n = json.loads(open(sys.argv[1]).read().splitlines()[0])
sick = [g for g in n["gpus"] if not g["healthy"]]
for g in n["gpus"]:
    print("GPU %d %s healthy=%s %s" % (g["index"], g["uuid"], g["healthy"], g.get("problem", "")))
# Where nvidia-ctk made a spec every GPU is healthy; else each says why not.
sys.exit(0 if all("no CDI device" in g.get("problem", "") for g in sick) else 1)
PY
then pass "each GPU is healthy or says which CDI device it lacks"; else fail "an unhealthy GPU without its reason"; fi
grep -q '"healthy": false' "$work/node-before.json" && sick_before=1 || sick_before=

section "a CDI spec for the GPUs (as nvidia-ctk would write it, plus glibc for busybox)"
python3 - "$work/cdi/gpu-check.json" <<'PY'
import glob, json, os, subprocess, sys
rows = subprocess.check_output(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"], text=True).strip().splitlines()
minors = {}
for d in glob.glob("/proc/driver/nvidia/gpus/*/information"):
    info = dict(l.split(":", 1) for l in open(d) if ":" in l)
    minors[os.path.basename(os.path.dirname(d)).lower()] = info.get("Device Minor", "").strip()
devices = []
for r in rows:
    idx, uuid, bus = [x.strip() for x in r.split(",")]
    minor = next((m for k, m in minors.items() if k.endswith(bus.lower()[-12:])), idx)
    devices.append({"name": uuid, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia%s" % minor}]}})
common = [p for p in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] if os.path.exists(p)]
# The driver's libraries where the dynamic linker finds them.
cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines()
libs = [l.split("=>")[-1].strip() for l in cache if l.strip().startswith(("libnvidia-ml.so.1 ", "libcuda.so.1 "))]
libdirs = sorted({os.path.dirname(os.path.realpath(p)) for p in libs})
ro = ["ro", "nosuid", "nodev", "bind"]
mounts = [{"hostPath": os.path.realpath(subprocess.check_output(["sh", "-c", "command -v nvidia-smi"], text=True).strip()), "containerPath": "/usr/bin/nvidia-smi", "options": ro},
          {"hostPath": os.path.realpath("/lib64/ld-linux-x86-64.so.2"), "containerPath": "/lib64/ld-linux-x86-64.so.2", "options": ro},
          {"hostPath": "/usr/lib/x86_64-linux-gnu", "containerPath": "/usr/lib/x86_64-linux-gnu", "options": ["ro", "nosuid", "nodev", "rbind"]}]
mounts += [{"hostPath": d, "containerPath": d, "options": ["ro", "nosuid", "nodev", "rbind"]} for d in libdirs if d != "/usr/lib/x86_64-linux-gnu"]
spec = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": devices,
        "containerEdits": {"deviceNodes": [{"path": p} for p in common], "mounts": mounts,
                           "env": ["LD_LIBRARY_PATH=" + ":".join(libdirs + ["/usr/lib/x86_64-linux-gnu"])]}}
json.dump(spec, open(sys.argv[1], "w"), indent=1)
print(json.dumps(spec, indent=1))
PY

section the agent sees the spec without a restart
# It checks the specs again every 30 s.
for _ in $(seq 1 90); do
	node_key >"$work/node.json"
	grep -q '"healthy": false' "$work/node.json" || break
	sleep 0.5
done
voyager node list -o wide
if [[ -z $sick_before ]]; then
	echo "every GPU was healthy already (a spec of nvidia-ctk's): nothing to see change"
elif grep -q '"healthy": false' "$work/node.json"; then
	fail "the agent did not offer the GPUs healthy within 45 s of their spec"
else
	pass "the agent offered the GPUs healthy once their spec was written, with no restart"
fi
cat "$work/node.json"
if python3 - "$work/node.json" "$work/nvidia-smi.csv" <<'PY'
import csv, json, sys
n = json.loads(open(sys.argv[1]).read().splitlines()[0])
rows = list(csv.reader(open(sys.argv[2]), skipinitialspace=True))[1:]
ok = len(rows) == len(n["gpus"]) and not n.get("simulated")
for r, g in zip(rows, n["gpus"]):
    idx, uuid, name, mem, bus, cc = r[0], r[1], r[2], int(r[3].split()[0]), r[4].lower()[-12:], r[5]
    want = (int(idx), uuid, name, mem, bus, int(cc.replace(".", "")), True)
    got = (g["index"], g["uuid"], g["model"], g["memoryMiB"], g.get("pciBusId", "")[-12:], g.get("cudaCompute"), g["healthy"])
    print("nvidia-smi", want, "\nvoyager   ", got)
    ok = ok and want == got
sys.exit(0 if ok else 1)
PY
then pass "the agent's NVML inventory matches nvidia-smi, every GPU healthy"; else fail "the agent's inventory differs from nvidia-smi"; fi
admin=$(voyager token -admin)
voyager volume create gpu-check-tools --host-path "$work/tools" --read-only --token "$admin" >/dev/null

section a session with one GPU
# $VOYAGER_GPU_TOPOLOGY names the GPUs the session was bound to.
timeout 180 voyager run --gpus 1 --volume gpu-check-tools:/tools -- sh -c 'ls -l /dev/nvidia*; echo "bound: $(grep -o "GPU-[0-9a-f-]*" "$VOYAGER_GPU_TOPOLOGY" | sort -u)"; /usr/bin/nvidia-smi -L && { [ ! -x /tools/vadd ] || /tools/vadd; }' >"$work/gpu-session.txt" 2>&1
rc=$?
cat "$work/gpu-session.txt"
bound=$(sed -n 's/^bound: //p' "$work/gpu-session.txt")
seen=$(grep -c '^GPU [0-9]*: ' "$work/gpu-session.txt")
if [[ $rc -eq 0 && $seen -eq 1 ]] && grep -q "UUID: ${bound:-none})" "$work/gpu-session.txt"; then
	pass "the session saw exactly its GPU ${bound} and ran on it"
else
	fail "the GPU session (exit $rc, GPUs seen $seen, bound '${bound}')"
fi

section a session without GPUs tries to reach one
timeout 120 voyager run -- sh -c 'ls /dev/nvidia* 2>/dev/null && echo "ATTACK: sees a GPU device"; if mknod /tmp/nv0 c 195 0 2>/dev/null; then (exec 3</tmp/nv0) 2>/dev/null && echo "ATTACK: opened a GPU"; fi; exit 0' >"$work/nogpu.txt" 2>&1
cat "$work/nogpu.txt"
if grep -q ATTACK "$work/nogpu.txt" || ! grep -q "Succeeded" "$work/nogpu.txt"; then fail "a session without GPUs reached one"; else pass "a session without GPUs sees and opens none"; fi

section the agent samples a busy GPU through NVML
timeout 120 voyager run --gpus 1 --volume gpu-check-tools:/tools -- sh -c 'if [ -x /tools/vadd ]; then /tools/vadd busy 10; else sleep 10; fi' >"$work/busy.txt" 2>&1 &
busy=$!
id=
for _ in $(seq 1 40); do
	id=$(sed -n 's/^voyager run: session \([a-z0-9]*\) submitted.*/\1/p' "$work/busy.txt")
	[[ -n $id ]] && break
	sleep 0.25
done
sampled=
for _ in $(seq 1 40); do
	sampled=$(voyager session get "$id" -o json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
gpus = ((s.get("status") or {}).get("activity") or {}).get("gpus") or []
busy = [g for g in gpus if g.get("utilizationPercent", 0) > 0 and g.get("processes", 0) > 0]
print(json.dumps(busy[0]) if busy else "")')
	[[ -n $sampled ]] && break
	sleep 0.5
done
wait "$busy"
cat "$work/busy.txt"
echo "activity: ${sampled:-none seen}"
curl -s http://127.0.0.1:7070/metrics | grep -E '^voyager_agent_gpu_' || echo "(no GPU metrics)"
if [[ ! -x $work/tools/vadd ]]; then
	echo "no vadd (no nvcc): the sampler's reading of a busy GPU is not checked"
elif [[ -n $sampled ]]; then
	pass "the agent saw its session's GPU busy, with its process, through NVML"
else
	fail "the agent never saw the busy GPU in the session's activity"
fi
stop_dev
echo
echo "gpu-check: $fails failure(s); dev's log: $work/dev.log"
exit "$fails"
