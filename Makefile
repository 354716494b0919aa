# Membrane. `make demo` runs the agent and a short demo on the fake
# datapath; `make test` runs every test (root tests too, when root).
GO      ?= go
BIN     := bin
PREFIX  ?= /usr/local
DESTDIR ?=
CMDS    := membrane-agent membrane-cni membranectl membrane-sim membrane-proxy
# Tests share 2 cores with the build; -p 2 keeps root tests from starving.
TESTFLAGS ?= -race -count=1 -p 2 -timeout 20m

# Where `make install` puts the CNI plugin and its conflist (under DESTDIR).
CNI_BIN_DIR  ?= /opt/cni/bin
CNI_CONF_DIR ?= /etc/cni/net.d
SYSTEMD_DIR  ?= /lib/systemd/system

.PHONY: all build image manifests test-chart test test-short e2e e2e-smoke e2e-down conformance conformance-smoke fuzz bench bench-headline bench-cni bench-bpf bench-kpr bench-policy bench-l7-http bench-l7-ack bench-restore bench-xnode bench-k8s bench-identity bench-mem generate demo vet lint clean install sim sim-scale soak

all: build

# The CNI plugin is exec'd per pod: a static binary skips the dynamic
# loader (about 1 ms per exec here).
build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ $(addprefix ./cmd/,$(filter-out membrane-cni,$(CMDS)))
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/membrane-cni

# The container image (deploy/kubernetes/membrane.yaml's), as a
# docker-archive tarball, without Docker or a registry: static programs
# on an empty base (cmd/membrane-image, pkg/image). Reproducible: the
# same sources give the same digest. Load it with
# `ctr -n k8s.io images import bin/membrane-image.tar`.
IMAGE_TAG     ?= localhost/membrane:dev
IMAGE_VERSION ?= dev
image:
	@mkdir -p $(BIN)/static
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(IMAGE_VERSION)" -o $(BIN)/static/ \
		./cmd/membrane-agent ./cmd/membrane-cni ./cmd/membrane-proxy ./cmd/membranectl
	$(GO) run ./cmd/membrane-image -bin $(BIN)/static -out $(BIN)/membrane-image.tar \
		-tag $(IMAGE_TAG) -version $(IMAGE_VERSION)

# The plain manifests of deploy/kubernetes/ rendered from the Helm chart's
# defaults (deploy/helm/membrane) with the Helm Go SDK, no helm binary
# (tools/chart, a module of its own: helm.sh/helm/v3 would raise the
# agent's dependencies). test-chart fails when they differ from a fresh
# render.
manifests:
	cd tools/chart && $(GO) run . manifests

# The chart's tests: values -> rendered objects, refused values, the
# committed manifests current.
test-chart:
	cd tools/chart && $(GO) vet ./... && $(GO) test -count=1 ./...

vet:
	$(GO) vet ./...

# Regenerates the BPF objects and bindings in bpf/ with bpf2go (needs
# clang, llvm and libbpf-dev: apt-get install clang llvm libbpf-dev; see
# bpf/doc.go for the versions used). The outputs are committed: build and
# test never need clang.
generate:
	$(GO) generate ./bpf/

# staticcheck at a pinned version, installed with go install into a
# cache directory outside the tree when missing (a fresh CI machine
# installs it once; a new version installs next to the old one).
STATICCHECK_VERSION ?= v0.8.2
TOOLS_DIR ?= $(HOME)/.cache/membrane/tools
STATICCHECK := $(TOOLS_DIR)/staticcheck-$(STATICCHECK_VERSION)/staticcheck

$(STATICCHECK):
	GOBIN=$(dir $@) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint: $(STATICCHECK)
	$(STATICCHECK) ./...

test: build vet lint test-chart
	$(GO) test $(TESTFLAGS) ./...
	$(MAKE) e2e-smoke
	$(MAKE) conformance-smoke

# The end-to-end suite (test/e2e, root): a control plane (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, CoreDNS as the
# cluster DNS) and NODES worker namespaces with containerd, kubelet and
# membrane-agent each; the kube binaries are built once per machine by
# scripts/kube-bin.sh, CoreDNS by scripts/coredns.sh. KEEP=1 leaves the
# cluster up (make e2e-down removes it). e2e-smoke is the one-node subset
# `make test` (and so CI) runs, on the same control plane.
NODES ?= 2
KEEP  ?=
E2E_RUN ?= .
E2E_BINS := kubelet kube-scheduler kube-controller-manager
e2e:
	scripts/kube-bin.sh $(E2E_BINS) kubectl >/dev/null
	scripts/coredns.sh >/dev/null
	scripts/e2e-bin.sh >/dev/null
	MEMBRANE_E2E=1 E2E_NODES=$(NODES) E2E_KEEP=$(KEEP) E2E_BIN_DIR=$$(scripts/e2e-bin.sh) \
		$(GO) test -count=1 -v -timeout 60m -run '$(E2E_RUN)' ./test/e2e/

e2e-smoke:
	scripts/kube-bin.sh $(E2E_BINS) >/dev/null
	scripts/coredns.sh >/dev/null
	MEMBRANE_E2E=1 E2E_NODES=1 E2E_KEEP=$(KEEP) \
		$(GO) test -count=1 -v -timeout 15m -run '^(TestSmoke|TestClusterDNS)$$' ./test/e2e/

e2e-down:
	MEMBRANE_E2E_DOWN=1 $(GO) test -count=1 -v -run '^$$' ./test/e2e/

# Upstream's sig-network suites (issue 33, root): e2e.test and agnhost
# built from k8s.io/kubernetes v1.35.4 by scripts/e2e-bin.sh (once per
# machine), run by test/e2e's TestConformance against a NODES-node
# cluster with Membrane as the CNI and kube-proxy replacement. SETS picks
# the sets (netpol, conformance, services; smoke is the CI subset),
# CONFORMANCE_JOBS runs that many at once, FOCUS=regexp runs just the
# specs it matches; JUnit, logs and summary.md go to RESULTS. See
# docs/conformance.md.
SETS    ?= netpol,conformance,services
FOCUS   ?=
RESULTS ?= $(CURDIR)/bin/conformance
CONFORMANCE_JOBS ?= 1
CONFORMANCE_BINS ?= $(E2E_BINS) kubectl
# TestConnectivity (membranectl connectivity test, issue 37) runs on the
# same cluster after the specs.
CONFORMANCE_RUN ?= ^(TestConformance|TestConnectivity)$$
conformance:
	scripts/kube-bin.sh $(CONFORMANCE_BINS) >/dev/null
	scripts/coredns.sh >/dev/null
	scripts/e2e-bin.sh >/dev/null
	MEMBRANE_E2E=1 E2E_NODES=$(NODES) E2E_KEEP=$(KEEP) E2E_KUBE_PROXY_REPLACEMENT=1 E2E_L7=1 \
		CONFORMANCE_BIN=$$(scripts/e2e-bin.sh) E2E_BIN_DIR=$$(scripts/e2e-bin.sh) \
		CONFORMANCE_SETS=$(SETS) CONFORMANCE_FOCUS='$(FOCUS)' CONFORMANCE_RESULTS=$(RESULTS) CONFORMANCE_JOBS=$(CONFORMANCE_JOBS) \
		$(GO) test -count=1 -v -timeout 4h -run '$(CONFORMANCE_RUN)' ./test/e2e/

# The CI-sized subset (under 10 minutes warm), the last step of make
# test: six NetworkPolicy specs and the granular pod-to-pod checks, on a
# 2-node cluster. Its specs never run kubectl, so kubectl (183 packages
# more to build) is left out.
conformance-smoke:
	$(MAKE) conformance SETS=smoke CONFORMANCE_BINS='$(E2E_BINS)'

test-short:
	$(GO) test -short -count=1 ./...

# Each fuzz target for FUZZTIME (go test -fuzz runs one target at a time).
FUZZTIME ?= 20s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./pkg/domain/labels/
	$(GO) test -run '^$$' -fuzz '^FuzzParseSet$$' -fuzztime $(FUZZTIME) ./pkg/domain/labels/
	$(GO) test -run '^$$' -fuzz '^FuzzParseSelector$$' -fuzztime $(FUZZTIME) ./pkg/domain/labels/
	$(GO) test -run '^$$' -fuzz '^FuzzQueries$$' -fuzztime $(FUZZTIME) ./pkg/agent/api/
	$(GO) test -run '^$$' -fuzz '^FuzzRequestPath$$' -fuzztime $(FUZZTIME) ./pkg/agent/api/
	$(GO) test -run '^$$' -fuzz '^FuzzEndpointChangeRequest$$' -fuzztime $(FUZZTIME) ./pkg/agent/api/
	$(GO) test -run '^$$' -fuzz '^FuzzRange$$' -fuzztime $(FUZZTIME) ./pkg/domain/ipam/
	$(GO) test -run '^$$' -fuzz '^FuzzChainedAttachment$$' -fuzztime $(FUZZTIME) ./pkg/clients/cni/
	$(GO) test -run '^$$' -fuzz '^FuzzParseKafkaRequest$$' -fuzztime $(FUZZTIME) ./datapath/l7proxy/proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzParseRef$$' -fuzztime $(FUZZTIME) ./pkg/domain/endpoint/
	$(GO) test -run '^$$' -fuzz '^FuzzEndpointChangeRequest$$' -fuzztime $(FUZZTIME) ./pkg/agent/api/
	$(GO) test -run '^$$' -fuzz '^FuzzAttachRequest$$' -fuzztime $(FUZZTIME) ./pkg/agent/api/
	$(GO) test -run '^$$' -fuzz '^FuzzEndpointJSON$$' -fuzztime $(FUZZTIME) ./pkg/agent/api/
	$(GO) test -run '^$$' -fuzz '^FuzzIPAMJSON$$' -fuzztime $(FUZZTIME) ./pkg/agent/api/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEndpoint$$' -fuzztime $(FUZZTIME) ./pkg/clients/client/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeIPAM$$' -fuzztime $(FUZZTIME) ./pkg/clients/client/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./pkg/clients/cni/
	$(GO) test -run '^$$' -fuzz '^FuzzParseArgs$$' -fuzztime $(FUZZTIME) ./pkg/clients/cni/
	$(GO) test -run '^$$' -fuzz '^FuzzReadAnswer$$' -fuzztime $(FUZZTIME) ./pkg/clients/cni/
	$(GO) test -run '^$$' -fuzz '^FuzzParseServerTiming$$' -fuzztime $(FUZZTIME) ./pkg/clients/cni/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./pkg/clients/cni/delqueue/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./pkg/domain/policy/
	$(GO) test -run '^$$' -fuzz '^FuzzRepository$$' -fuzztime $(FUZZTIME) ./pkg/domain/policy/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeDrop$$' -fuzztime $(FUZZTIME) ./datapath/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME) ./pkg/agent/health/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./restore/
	$(GO) test -run '^$$' -fuzz '^FuzzEncode$$' -fuzztime $(FUZZTIME) ./restore/

# Benchmarks recorded in BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 200000x ./pkg/domain/ipam/
	$(GO) test -run '^$$' -bench 'Lifecycle|HeapPerEndpoint' -benchtime 2s ./pkg/agent/api/
	$(GO) test -run '^$$' -bench OperatorQueries10k -benchtime 50x ./pkg/agent/api/
	$(GO) test -run '^$$' -bench . -benchtime 20x ./pkg/domain/policy/
	$(GO) test -run '^$$' -bench BenchmarkPolicyPropagation -benchtime 20x ./test/policyscenario/

# Every headline number of BENCHMARKS.md from one run, as one table with
# its targets, the date and the load average (root for the CNI, restore
# and policy parts; see scripts/bench-headline.sh for the sizes).
bench-headline:
	BENCH_OUT=$(BENCH_OUT) scripts/bench-headline.sh

# CNI ADD/DEL latency and concurrent ADD throughput, Membrane against the
# reference ptp + host-local plugins (root; see docs/cni-bench.md).
# BENCH_N sequential ADDs then DELs, BENCH_CONC concurrent ADD workers;
# BENCH_STACK=dual gives both arms an IPv4 and an IPv6 range. From the
# environment: BENCH_TCX=0 drops the TCX arm; BENCH_BASE_PLUGIN=<binary>
# adds arms running that plugin binary (an A/B of the plugin alone);
# BENCH_AGENT=<binary> runs that membrane-agent for every arm;
# BENCH_FLOWS=ab adds an arm with --flows=false (flow reports off).
BENCH_N     ?= 200
BENCH_CONC  ?= 8
BENCH_STACK ?= ipv4
bench-cni:
	MEMBRANE_BENCH_CNI=1 BENCH_N=$(BENCH_N) BENCH_CONC=$(BENCH_CONC) BENCH_STACK=$(BENCH_STACK) \
		$(GO) test -run '^TestCNIBench$$' -count=1 -v -timeout 30m ./test/cnibench/

# Time from PUT /v1/policy until BENCH_ENDPOINTS endpoints with real BPF
# programs realised it, BENCH_ROUNDS times (root).
BENCH_ENDPOINTS ?= 200
BENCH_ROUNDS    ?= 5
bench-policy:
	MEMBRANE_BENCH_POLICY=1 BENCH_ENDPOINTS=$(BENCH_ENDPOINTS) BENCH_ROUNDS=$(BENCH_ROUNDS) \
		$(GO) test -run '^TestPolicyBench$$' -count=1 -v -timeout 30m ./test/policybench/

# L7 (issue 21, root): HTTP latency through the transparent proxy
# against the same request without L7 policy (same run) and requests/s;
# time from an L7 policy import to the proxy's acknowledgement with
# BENCH_ENDPOINTS endpoints.
bench-l7-http:
	MEMBRANE_BENCH_L7=1 $(GO) test -run '^TestBenchHTTPLatency$$' -count=1 -v -timeout 20m ./test/l7/
bench-l7-ack:
	MEMBRANE_BENCH_L7=1 BENCH_ENDPOINTS=$(BENCH_ENDPOINTS) BENCH_ROUNDS=$(BENCH_ROUNDS) \
		$(GO) test -run '^TestBenchImportToAck$$' -count=1 -v -timeout 30m ./test/l7/

# Kubernetes mode (root, kube-apiserver from scripts/kube-bin.sh): pod
# relabel until the new identity is realised with 100 pods, NetworkPolicy
# creation until 200 endpoints with real BPF programs enforce it.
bench-k8s:
	MEMBRANE_BENCH_K8S=1 $(GO) test -run '^TestK8sBench$$' -count=1 -v -timeout 30m ./test/k8sbench/

# The agent's resident memory (root; test/agentmem): the real
# membrane-agent process with the DaemonSet's flags, standalone on the
# Linux datapath with MEM_PODS pods, and in Kubernetes mode against a
# real kube-apiserver with MEM_PODS local pods and MEM_REMOTE other
# nodes' MembraneEndpoints (over MEM_REMOTE_NODES nodes): VmRSS,
# RssAnon, RssFile, Pss, the Go heap, and the executable's resident
# pages by section and package.
MEM_PODS   ?= 110
MEM_REMOTE ?= 5000
bench-mem:
	MEMBRANE_BENCH_MEM=1 MEM_PODS=$(MEM_PODS) MEM_REMOTE=$(MEM_REMOTE) \
		$(GO) test -run '^TestMem' -count=1 -v -timeout 30m ./test/agentmem/

# Endpoint BPF programs (root): first realise (load + attach), identity
# change, policy-only regeneration and kernel memory per endpoint, with
# TCX and with the cls_bpf fallback, over BENCH_N endpoints; and what flow
# reports cost (TestBPFFlowsBench: flows off and on in one run).
bench-bpf:
	MEMBRANE_BENCH_BPF=1 BENCH_N=$(BENCH_N) \
		$(GO) test -run '^TestBPF(Flows)?Bench$$' -count=1 -v -timeout 30m ./datapath/

# The kube-proxy-free mode against kube-proxy's iptables rules, one run
# (root): host connect() to a ClusterIP, NodePort from outside.
bench-kpr:
	MEMBRANE_BENCH_KPR=1 BENCH_N=$(or $(KPR_N),1000) \
		$(GO) test -run '^TestKPRBench$$' -count=1 -v -timeout 30m ./datapath/

# Agent restart time with RESTORE_N endpoints on the Linux datapath (root).
RESTORE_N ?= 100
bench-restore:
	MEMBRANE_BENCH_RESTORE=1 RESTORE_N=$(RESTORE_N) \
		$(GO) test -run '^TestRestoreTime$$' -count=1 -v -timeout 10m ./test/crash/

# Cross-node TCP throughput and latency, native and tunnel mode, and
# same-node throughput and request/response rate, against
# plain veths and routes without BPF (root; BENCHMARKS.md).
bench-xnode:
	MEMBRANE_XNODE_BENCH=1 $(GO) test -run '^Test(CrossNode|SameNode)Numbers$$' -count=1 -v -timeout 15m ./test/multinode/

# Cluster identities through the API server (issue 14): two, then four
# agent processes race to allocate IDRACE_COUNT label sets as
# MembraneIdentity objects on a real kube-apiserver (scripts/kube-bin.sh);
# the numbers go to the test log and to IDENTITY_BENCH_OUT.
IDRACE_COUNT ?= 1000
IDENTITY_BENCH_OUT ?= /dev/null
bench-identity:
	IDRACE_COUNT=$(IDRACE_COUNT) IDENTITY_BENCH_OUT=$(IDENTITY_BENCH_OUT) \
		$(GO) test -run '^TestRaceAgents$$' -count=1 -v -timeout 20m ./pkg/agent/k8s/identitycrd/

# Installs the binaries under PREFIX, membrane-cni into CNI_BIN_DIR, the
# conflist into CNI_CONF_DIR and the agent's systemd unit, all under DESTDIR.
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(CNI_BIN_DIR) $(DESTDIR)$(CNI_CONF_DIR) $(DESTDIR)$(SYSTEMD_DIR)
	install -m 0755 $(BIN)/membrane-agent $(BIN)/membranectl $(BIN)/membrane-proxy $(DESTDIR)$(PREFIX)/bin/
	install -m 0755 $(BIN)/membrane-cni $(DESTDIR)$(CNI_BIN_DIR)/membrane-cni
	install -m 0644 deploy/05-membrane.conflist $(DESTDIR)$(CNI_CONF_DIR)/05-membrane.conflist
	sed 's|/usr/local/bin/|$(PREFIX)/bin/|g' deploy/membrane-agent.service > $(DESTDIR)$(SYSTEMD_DIR)/membrane-agent.service
	chmod 0644 $(DESTDIR)$(SYSTEMD_DIR)/membrane-agent.service

demo: build
	./scripts/demo.sh

# membrane-sim on a scenario (default: 10,000 live endpoints, 30 s of
# churn); e.g. make sim SCENARIO=sim/scenarios/chaos.json, or
# make sim SIMFLAGS="--endpoints 2000 --duration 10s". Writes
# sim-report.json and sim-report.html; exits 1 on a violation.
SCENARIO ?= sim/scenarios/default.json
SIMFLAGS ?=
sim:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ ./cmd/membrane-sim
	$(BIN)/membrane-sim --scenario $(SCENARIO) --report sim-report.json --html sim-report.html $(SIMFLAGS)

# Node-count sweep (issue 40): one membrane-sim --nodes run per count in
# SCALE_NODES, SCALE_ENDPOINTS live endpoints over the cluster (per node:
# divided by the count), churn SCALE_CHURN lifecycles/s over the cluster
# for SCALE_DURATION, etcd as its own process (etcd-embed from
# scripts/kube-bin.sh), state on tmpfs. Writes one table (convergence
# after and including the ramp-up, CPU per remote update, heap per remote
# endpoint, etcd CPU) and the slopes fitted across the runs to
# $(BIN)/sim-scale.{json,html}; exits 1 on a violation.
SCALE_NODES     ?= 10 30 50 100
SCALE_ENDPOINTS ?= 2000
SCALE_CHURN     ?= 100
SCALE_DURATION  ?= 30s
sim-scale:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ ./cmd/membrane-sim
	$(BIN)/membrane-sim --sweep-nodes "$(SCALE_NODES)" --sweep-endpoints $(SCALE_ENDPOINTS) --churn-rate $(SCALE_CHURN) \
		--duration $(SCALE_DURATION) --etcd-bin "$$(scripts/kube-bin.sh)/etcd-embed" \
		--report $(BIN)/sim-scale.json --html $(BIN)/sim-scale.html $(SIMFLAGS)

# Soak (issue 38): membrane-sim's churn for SOAK on the fake datapath
# (2,000 live endpoints, agent crashes), then for SOAK_LINUX on the Linux
# datapath (root: the real plugin, a netns and veth per pod, BPF). Each
# exits 1 on a violation, a leak the end checks find (address, identity,
# veth, pin) or a resource that grew over the churn's second half
# (--soak: heap, goroutines, fds, state directory, pins). Reports in
# $(BIN)/soak-{fake,linux}.{json,html}; docs/faults.md has a run.
SOAK       ?= 10m
SOAK_LINUX ?= 3m
soak:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ ./cmd/membrane-sim ./cmd/membrane-cni ./cmd/membrane-proxy
	$(BIN)/membrane-sim --soak --endpoints 2000 --duration $(SOAK) --crashes 2 --progress never \
		--report $(BIN)/soak-fake.json --html $(BIN)/soak-fake.html
	$(BIN)/membrane-sim --soak --datapath linux --endpoints 100 --duration $(SOAK_LINUX) --cni-bin $(BIN) --progress never \
		--report $(BIN)/soak-linux.json --html $(BIN)/soak-linux.html

clean:
	rm -rf $(BIN)
