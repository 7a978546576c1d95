# Voyager's build, test and lint entry points. Taskfile.yml has the same
# targets; keep the two in step.

VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
BENCHTIME ?= 1s
# BENCHCOUNT runs every benchmark that many times; the summary table shows each figure's median with min–max.
BENCHCOUNT ?= 1
STATICCHECK_VERSION := v0.8.2
# Where make image keeps the notebook image's archive (outside the repo).
IMAGE_CACHE ?= $(or $(VOYAGER_IMAGE_CACHE),$(HOME)/.cache/voyager/images)

# go-nvml resolves NVML symbols at run time; Debian's linker binds eagerly
# unless told otherwise, so every binary and test binary links lazily.
LAZY := -extldflags=-Wl,-z,lazy
BUILD_LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -extldflags "-Wl,-z,lazy"

.PHONY: build dev image test test-short bench bench-scale sim sim-gap sim-gap-scale sim-power sim-elastic gpu-check lint e2e soak clean-host

## build: bin/voyager with the version stamped in
build:
	go build -ldflags '$(BUILD_LDFLAGS)' -o bin/voyager ./cmd/voyager

## dev: build, install containerd/runc/busybox-static if missing (deploy/dev-setup.sh),
## then run an all-in-one Voyager (embedded etcd, placer, agent, HTTP) until Ctrl-C
dev: build
	deploy/dev-setup.sh
	bin/voyager dev

## image: build voyager.local/jupyter:latest from Debian's packages (deploy/images/jupyter/build.sh,
## cached in IMAGE_CACHE; root) and load it into the node agent's containerd (voyager dev's)
image: build
	deploy/images/jupyter/build.sh $(IMAGE_CACHE)/voyager.local-jupyterlab.tar
	bin/voyager image load $(IMAGE_CACHE)/voyager.local-jupyterlab.tar

## test: install what the tests need if missing (deploy/test-setup.sh), then the whole suite:
## Go with the race detector; the placement simulator's tests again without it (under it each 200-node policy
## test runs a few of its seeds and strategies, without it every one: about 8½ minutes); then the JupyterHub
## spawner's tests (what CI runs).
## VOYAGER_TEST_REQUIRE=all (internal/testreq): a test whose real component is missing fails, never skips.
test:
	deploy/test-setup.sh
	VOYAGER_TEST_REQUIRE=all go test -race -count=1 -timeout 60m -ldflags=$(LAZY) ./...
	go test -count=1 -timeout 30m -ldflags=$(LAZY) ./placer/sim/
	/usr/bin/python3 -m unittest discover -s deploy/jupyterhub/tests

## soak: the randomized soak (history/soak_test.go) for SOAK_BINDS binds (default 1,000,000), without
## the race detector: placers, agents, the lifecycle and array controllers and users with chaos (leader kills,
## node etcd outages, agent processes paused, inventory changes, cordons, quotas) on a 3-member etcd (etcd's own
## server at go.mod's version, run by the test binary: -soak.etcd=module), the history checker over the whole
## history; 24 nodes and 240 live sessions (the pace of 10 nodes is their GPUs'); logs progress every minute and
## reports binds, violations (must be 0), wall and CPU time and binds/s
SOAK_BINDS ?= 1000000
soak:
	go test -count=1 -timeout 0 -ldflags=$(LAZY) -run '^TestSoak$$' -v ./history/ -args -soak.binds=$(SOAK_BINDS) -soak.etcd=module -soak.nodes=24 -soak.live=240 -soak.every=1m

## test-short: a quick local loop; skips tests that build and run processes
test-short:
	go test -short -ldflags=$(LAZY) ./...

## bench: build, the Jupyter image's archive if missing (deploy/images/jupyter/build.sh, cached in IMAGE_CACHE; root, about
## 2 minutes; if it cannot be built the agent benchmark reports its Jupyter figures as skipped), then every benchmark, each
## bounded by BENCHTIME (default 1s), one package at a time (a benchmark measures a quiet machine), the agent's with
## bin/voyager as its own process; then one summary table of the figures benchmarks recorded (internal/benchsum) with their
## ratio to the ceiling measured in the same run
bench: build
	@deploy/images/jupyter/build.sh $(IMAGE_CACHE)/voyager.local-jupyterlab.tar || \
		echo "make bench: the Jupyter image could not be built: the agent benchmark reports its Jupyter figures as skipped"
	@summary=$$(mktemp); \
	VOYAGER_IMAGE_CACHE=$(IMAGE_CACHE) VOYAGER_BENCH_BINARY=$(CURDIR)/bin/voyager BENCH_SUMMARY=$$summary \
		go test -p 1 -run '^$$' -bench . -benchtime $(BENCHTIME) -count $(BENCHCOUNT) -timeout 120m -ldflags=$(LAZY) ./...; rc=$$?; \
	echo; go run ./internal/benchsum/benchtable $$summary; rm -f $$summary; exit $$rc

## sim: placer/sim's whole suite of workload shapes (placer/README.md, "The simulator"): every shape at 16, 200 and
## 2,000 nodes (2,000 over a quarter of the simulated hours), binpack and spread, seeds 1-3, default settings; one table
## with the goals each run misses (exit 1 if any). SIMFLAGS passes flags (-nodes, -seeds, -hours, -shape, -without)
sim:
	go run ./placer/sim/simsuite $(SIMFLAGS)

## sim-gap: the planner's gap to the optimum (placer/README.md, "Against an optimum"): every shape of the suite at 16
## nodes over a quarter of its hours, binpack and spread, seed 1; exact when small, else ε-NSGA-II. SIMFLAGS passes
## flags (-nodes, -hours, -seeds, -shape, -strategies, -population, -generations)
sim-gap:
	go run ./placer/sim/simgap $(SIMFLAGS)

## sim-gap-scale: the planner's gap at 200 and 2,000 nodes (placer/README.md, "At 200 and 2,000 nodes"): every shape over a
## quarter of its hours, binpack, seed 1; the lower bound, the rolling-horizon search and each seed order alone (no
## ε-NSGA-II: too slow at that size). SIMFLAGS passes flags (-seeds, -shape, -short-first, -window, ...)
sim-gap-scale:
	go run ./placer/sim/simgap -nodes 200 -strategies binpack -search-limit 1 -orders $(SIMFLAGS)
	go run ./placer/sim/simgap -nodes 2000 -strategies binpack -search-limit 1 -orders $(SIMFLAGS)

## sim-power: the pack strategy against binpack and spread (placer/README.md, "Fewer active machines"): active machines,
## machines empty 30 min, waits, at 16 and 200 nodes. SIMFLAGS passes flags (-nodes, -hours, -seeds, -shape)
sim-power:
	go run ./placer/sim/simpower $(SIMFLAGS)

## sim-elastic: elastic jobs against the same jobs fixed at their minimum and maximum, size-blind and with goodput
## reports (placer/README.md, "Elastic jobs against fixed sizes"): mean and p99 completion time on 5 shapes, seeds 1-3,
## 16 nodes. SIMFLAGS passes flags (-nodes, -seeds, -shape)
sim-elastic:
	go run ./placer/sim/simelastic $(SIMFLAGS)

## bench-scale: the large-site runs against one real etcd each: a load generator registers SCALE_NODES lease-backed
## 8-GPU nodes and queues SCALE_SESSIONS sessions, then one real `voyager placer` (bin/voyager) fills the cluster
## (placer/scale_bench_test.go: time to full, bindings/s, placer CPU per binding, peak RSS, cache lag, etcd db size),
## and one real `voyager api`, on a cluster another real placer has filled, takes creates and GETs beside the etcd ceiling (api/scale_bench_test.go)
SCALE_NODES ?= 1000
SCALE_SESSIONS ?= 20000
bench-scale: build
	@summary=$$(mktemp); \
	BENCH_SUMMARY=$$summary go test -run '^$$' -bench '^BenchmarkPlacementScale$$' -benchtime 1x -timeout 60m -ldflags=$(LAZY) ./placer/ \
		-args -scale.bin=$(CURDIR)/bin/voyager -scale.nodes=$(SCALE_NODES) -scale.sessions=$(SCALE_SESSIONS); rc=$$?; \
	BENCH_SUMMARY=$$summary go test -run '^$$' -bench '^BenchmarkAPIScale$$' -benchtime 1x -timeout 60m -ldflags=$(LAZY) ./api/ \
		-args -scale.bin=$(CURDIR)/bin/voyager -scale.nodes=$(SCALE_NODES) -scale.sessions=$(SCALE_SESSIONS) || rc=$$?; \
	echo; go run ./internal/benchsum/benchtable $$summary; rm -f $$summary; exit $$rc

## gpu-check: on a machine with NVIDIA GPUs, as root: voyager dev on its real GPUs, checked end to end (NVML
## inventory against nvidia-smi, a GPU without a CDI device offered unhealthy, a session on its GPU running
## nvidia-smi and a CUDA program, a session without GPUs unable to reach one, two fractions of a shared GPU
## under the agent's CUDA MPS daemon within and beyond their limits); deploy/gpu-check/README.md
gpu-check: build
	PATH=$(CURDIR)/bin:$$PATH deploy/gpu-check/gpu-check.sh

## lint: go vet, gofmt (lists unformatted files), staticcheck
lint:
	go vet ./...
	@files=$$(gofmt -l .); if [ -n "$$files" ]; then echo "gofmt: these files need gofmt -w:"; echo "$$files"; exit 1; fi
	@if GOBIN=$(CURDIR)/bin go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); then \
		bin/staticcheck ./...; \
	else \
		echo "staticcheck $(STATICCHECK_VERSION) could not be installed from the module proxy; skipped"; \
	fi

## e2e: only the end-to-end tests (real processes, real etcd): names with E2E
e2e:
	go test -race -count=1 -timeout 30m -ldflags=$(LAZY) -run E2E ./...

## clean-host: as root, remove every Voyager object left on this machine, in use or not (stop voyager dev and tests
## first): containers in voyager* containerd namespaces and agents' recorded ones, isolated networks (bridges, iptables
## chains, CNI records), the tests' network namespaces and bridges, simulated CDI specs, unused private test containerds
## (internal/hostclean). Every test binary already sweeps what ended test runs left, at its start; this is for the rest.
clean-host:
	go run -ldflags=$(LAZY) ./internal/hostclean/cmd/clean-host
