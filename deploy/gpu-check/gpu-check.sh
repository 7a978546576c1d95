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
#   4. a session without GPUs has no GPU device node and cannot make one;
#   5. sharing (issue 35): with a GPU shared, the agent's MPS control
#      daemon (under the data dir) serves two fractions of one owner, each
#      with its limits in its environment, allocating within them; one
#      allocating beyond its limit fails; NVML per process shows each
#      fraction's own memory in its activity; the daemon stops with dev.
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

section "sharing: fractions of one GPU under CUDA MPS (issue 35)"
# voyager dev again, with the first GPU not in MIG mode shared. Nothing
# of the machine's settings changes (MIG mode included): the MPS control
# daemon is the agent's own, its pipe and log directories under
# $VOYAGER_DATA_DIR/mps/<GPU UUID>, and the agent stops it once no
# fraction of the GPU is held. Written without a GPU to run it on: the
# first run on one is its test.
share=$(python3 -c '
import csv, sys
rows = list(csv.reader(open(sys.argv[1]), skipinitialspace=True))[1:]
print(next((r[1] + " " + r[3].split()[0] for r in rows if r[6].strip() not in ("Enabled",)), ""))' "$work/nvidia-smi.csv")
if [[ -z $share ]]; then
	echo "every GPU is in MIG mode: a MIG GPU is never shared, so sharing is not checked"
elif ! command -v nvidia-cuda-mps-control >/dev/null; then
	fail "no nvidia-cuda-mps-control on PATH: the agent cannot enforce fractions here"
elif [[ ! -x $work/tools/vadd ]]; then
	echo "no vadd (no nvcc): fractions' limits cannot be exercised; sharing is not checked"
else
	read -r shared_uuid shared_mib <<<"$share"
	frac=$((shared_mib / 4))   # each fraction a quarter of the GPU
	within=$((frac / 2))       # what a session allocates within its limit
	beyond=$((frac + 1024))    # and beyond it
	VOYAGER_AGENT_CDI_SPEC_DIRS=/etc/cdi,/var/run/cdi,$work/cdi VOYAGER_AGENT_SHARED_GPUS=$shared_uuid start_dev
	node_key >"$work/node-shared.json"
	if python3 -c 'import json,sys; n=json.loads(open(sys.argv[1]).readline()); sys.exit(0 if any(g["uuid"]==sys.argv[2] and g.get("shared") for g in n["gpus"]) else 1)' "$work/node-shared.json" "$shared_uuid"; then
		pass "the agent offers $shared_uuid in fractions ($shared_mib MiB)"
	else
		fail "the agent does not offer $shared_uuid as shared"
	fi
	# Two fractions of one owner, each printing its MPS limits and
	# holding half its memory for 40 s; the second allocates twice what
	# the first does, so that their own usages differ.
	show='env | grep -E "^(CUDA_MPS|CUDA_VISIBLE|VOYAGER_GPU)" | sort; ls -ld /run/voyager/mps 2>&1;'
	timeout 240 voyager run --gpu-share "$frac" --gpu-compute 50 --volume gpu-check-tools:/tools -- sh -c "$show /tools/vadd alloc $((within / 2)) 40" >"$work/frac-a.txt" 2>&1 &
	fa=$!
	timeout 240 voyager run --gpu-share "$frac" --volume gpu-check-tools:/tools -- sh -c "$show /tools/vadd alloc $within 40" >"$work/frac-b.txt" 2>&1 &
	fb=$!
	ida= idb=
	for _ in $(seq 1 80); do
		ida=$(sed -n 's/^voyager run: session \([a-z0-9]*\) submitted.*/\1/p' "$work/frac-a.txt")
		idb=$(sed -n 's/^voyager run: session \([a-z0-9]*\) submitted.*/\1/p' "$work/frac-b.txt")
		[[ -n $ida && -n $idb ]] && break
		sleep 0.25
	done
	# Both on the GPU: the daemon serves them, NVML lists them, and each
	# session's activity is its own process's memory.
	own_mib() { # the memory the agent read of the session's own processes
		voyager session get "$1" -o json 2>/dev/null | python3 -c '
import json, sys
gs = ((json.load(sys.stdin).get("status") or {}).get("activity") or {}).get("gpus") or []
print(max([g.get("memoryUsedMiB", 0) for g in gs if g.get("processes", 0) > 0] or [0]))'
	}
	ma=0 mb=0
	for _ in $(seq 1 120); do
		ma=$(own_mib "$ida") mb=$(own_mib "$idb")
		[[ $ma -ge $((within / 2)) && $mb -ge $within ]] && break
		sleep 0.5
	done
	pipe=$VOYAGER_DATA_DIR/mps/$shared_uuid/pipe
	daemon=$(cat "$pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)
	servers=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 nvidia-cuda-mps-control 2>&1)
	echo "MPS control daemon (pipe $pipe): servers: ${servers:-none}"
	pgrep -a -f nvidia-cuda-mps || true
	nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
	if [[ -n $servers && $servers =~ ^[0-9] ]]; then
		pass "the agent's MPS control daemon for $shared_uuid runs under its data directory and serves a server"
	else
		fail "no MPS server behind the agent's daemon for $shared_uuid"
	fi
	echo "own memory as the agent read it: $ida ${ma} MiB (allocated $((within / 2))), $idb ${mb} MiB (allocated $within)"
	if [[ $ma -ge $((within / 2)) && $mb -ge $within && $ma -lt $mb ]]; then
		pass "NVML per process: each fraction's activity shows its own memory, not the GPU's"
	else
		fail "the fractions' activity does not show their own memory ($ma and $mb MiB)"
	fi
	wait "$fa"; ra=$?
	wait "$fb"; rb=$?
	cat "$work/frac-a.txt" "$work/frac-b.txt"
	if [[ $ra -eq 0 && $rb -eq 0 ]] && grep -q "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=${frac}M" "$work/frac-a.txt" &&
		grep -q "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" "$work/frac-a.txt" && grep -q "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=${frac}M" "$work/frac-b.txt" &&
		grep -q "vadd: alloc" "$work/frac-b.txt"; then
		pass "two fractions of one owner shared $shared_uuid, each saw its limits and allocated within them"
	else
		fail "the two fractions (exit $ra and $rb; limits or allocations missing above)"
	fi
	# Beyond its limit: MPS refuses the allocation.
	timeout 240 voyager run --gpu-share "$frac" --volume gpu-check-tools:/tools -- sh -c "/tools/vadd alloc $beyond 1" >"$work/frac-over.txt" 2>&1
	ro=$?
	cat "$work/frac-over.txt"
	if [[ $ro -ne 0 ]] && grep -q "alloc $beyond MiB failed" "$work/frac-over.txt"; then
		pass "a fraction of $frac MiB allocating $beyond MiB failed, with CUDA's reason"
	else
		fail "a fraction allocated beyond its $frac MiB limit (exit $ro)"
	fi
	# No fraction of the GPU is held any more: the agent stops its daemon.
	for _ in $(seq 1 120); do
		[[ -n $daemon ]] && kill -0 "$daemon" 2>/dev/null || break
		sleep 0.5
	done
	if [[ -z $daemon ]]; then
		fail "the agent's MPS daemon left no pid file in $pipe"
	elif kill -0 "$daemon" 2>/dev/null; then
		fail "the agent's MPS daemon (pid $daemon) still runs 60 s after the last fraction ended"
	else
		pass "the agent stopped its MPS daemon (pid $daemon) once no fraction held the GPU"
	fi
	stop_dev
fi
echo
echo "gpu-check: $fails failure(s); dev's log: $work/dev.log"
exit "$fails"
