# runledger — build, test and tooling. Tools are pinned and installed under bin/.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
BIN := $(ROOT)/bin
export GOBIN := $(BIN)

GOLANGCI_LINT_VERSION := v2.15.0
# shellcheck from Debian's apt (the version of its package, then the one the binary reports).
SHELLCHECK_DEB_VERSION := 0.9.0-1
SHELLCHECK_VERSION := 0.9.0
CONTROLLER_TOOLS_VERSION := v0.23.0
# gocyclo: no function outside tests and generated code above this cyclomatic complexity.
GOCYCLO_VERSION := v0.6.0
GOCYCLO_OVER := 30
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
GOCYCLO := $(BIN)/gocyclo-$(GOCYCLO_VERSION)
# helm: the version hack/tools/helm/go.mod pins (one source), built from the Go module proxy.
HELM_VERSION := $(shell awk '$$1 == "helm.sh/helm/v3" { print $$2; exit }' $(ROOT)/hack/tools/helm/go.mod)
HELM := $(BIN)/helm-$(HELM_VERSION)
# promtool for the alert rules' unit tests: Prometheus' Go module version
# (hack/tools/promtool pins it; v0.316.0 is Prometheus 3.16.0).
PROMETHEUS_VERSION := v0.316.0
PROMTOOL := $(BIN)/promtool-$(PROMETHEUS_VERSION)
# SeaweedFS' weed, the S3-compatible server of the object-store tests
# (internal/s3test): the version hack/tools/seaweedfs/go.mod pins (one
# source), built from the Go module proxy: about 8 CPU-minutes from empty caches
# (6 to 17 minutes of wall time on a busy 2-core host), 2 GB of modules and
# 2 GB of build cache; a 160 MB binary.
SEAWEEDFS_VERSION := $(shell awk '{ for (i = 1; i < NF; i++) if ($$i == "github.com/seaweedfs/seaweedfs") { print $$(i + 1); exit } }' $(ROOT)/hack/tools/seaweedfs/go.mod)
WEED := $(BIN)/weed-$(SEAWEEDFS_VERSION)

# envtest: kube-apiserver and etcd built from the Go module proxy (hack/k8s-bins.sh).
ENVTEST_ASSETS = $(shell $(ROOT)/hack/k8s-bins.sh --print-dir kube-apiserver etcd kubectl)

GO_TEST_FLAGS ?= -count=1 -timeout 30m

.PHONY: all
all: build

##@ Build

# The build's identity, stamped into the binary (runledger version, the
# runledger_build_info metric). Override both when building outside git.
VERSION ?= $(shell git -C $(ROOT) describe --always --dirty 2>/dev/null || echo unknown)
COMMIT ?= $(shell git -C $(ROOT) rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/runledger/runledger/internal/version.version=$(VERSION) \
	-X github.com/runledger/runledger/internal/version.commit=$(COMMIT)

.PHONY: build
build: ## Build bin/runledger and the worker binary bin/runledger-worker (static; VERSION and COMMIT default to git describe and the HEAD commit).
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/runledger .
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/runledger-worker ./cmd/runledger-worker

##@ Image

# make image: an OCI image layout in bin/image (an index of one image per
# platform: /runledger, the entrypoint, and the worker binary
# /runledger-worker that worker pods run), built without a daemon by
# hack/tools/image; make push sends it.
PLATFORMS ?= linux/amd64 linux/arm64
IMG ?=
SOURCE_URL ?= https://github.com/runledger/runledger
IMAGE_TOOL := $(BIN)/cluster-tools/image
IMAGE_LAYOUT := $(BIN)/image
PROCESSOR_IMAGE_LAYOUT := $(BIN)/image-processor

.PHONY: image
image: ## Build the runledger image (/runledger and /runledger-worker) into bin/image and the example processor's (examples/processor) into bin/image-processor (OCI layouts, no daemon): static binaries for PLATFORMS, no shell, user 65532, OCI labels; same commit, same digest.
	@mkdir -p $(dir $(IMAGE_TOOL))
	cd $(ROOT)/hack/tools/image && GOWORK=off CGO_ENABLED=0 go build -trimpath -o $(IMAGE_TOOL) .
	bins=(); for p in $(PLATFORMS); do \
		out=$(BIN)/platforms/$${p//\//_}/runledger; \
		CGO_ENABLED=0 GOOS=$${p%%/*} GOARCH=$${p#*/} go build -trimpath -ldflags "$(LDFLAGS)" -o $$out $(ROOT); \
		CGO_ENABLED=0 GOOS=$${p%%/*} GOARCH=$${p#*/} go build -trimpath -ldflags "$(LDFLAGS)" -o $$out-worker $(ROOT)/cmd/runledger-worker; \
		bins+=(-binary "$$p=$$out,$$out-worker"); \
	done; \
	$(IMAGE_TOOL) build -o $(IMAGE_LAYOUT) "$${bins[@]}" -path /runledger \
		-label org.opencontainers.image.source=$(SOURCE_URL) \
		-label org.opencontainers.image.version=$(VERSION) \
		-label org.opencontainers.image.revision=$(COMMIT)
	bins=(); for p in $(PLATFORMS); do \
		out=$(BIN)/platforms/$${p//\//_}/example-processor; \
		CGO_ENABLED=0 GOOS=$${p%%/*} GOARCH=$${p#*/} go build -trimpath -ldflags "-s -w" -o $$out $(ROOT)/examples/processor; \
		bins+=(-binary "$$p=$$out"); \
	done; \
	$(IMAGE_TOOL) build -o $(PROCESSOR_IMAGE_LAYOUT) "$${bins[@]}" -path /processor \
		-label org.opencontainers.image.source=$(SOURCE_URL) \
		-label org.opencontainers.image.version=$(VERSION) \
		-label org.opencontainers.image.revision=$(COMMIT)

.PHONY: push-processor
push-processor: image ## Push the example processor's image (examples/processor, built by make image into bin/image-processor): make push-processor IMG=registry.example/runledger-example-processor:TAG; prints REPOSITORY@DIGEST.
	@[ -n "$(IMG)" ] || { echo "make push-processor: set IMG=REGISTRY/REPOSITORY:TAG"; exit 1; }
	$(IMAGE_TOOL) push $(if $(INSECURE),-insecure) $(PROCESSOR_IMAGE_LAYOUT) $(IMG)

.PHONY: push
push: image ## Push the image: make push IMG=registry.example/runledger:TAG (credentials of ~/.docker/config.json; INSECURE=1 for plain HTTP); prints REPOSITORY@DIGEST.
	@[ -n "$(IMG)" ] || { echo "make push: set IMG=REGISTRY/REPOSITORY:TAG"; exit 1; }
	$(IMAGE_TOOL) push $(if $(INSECURE),-insecure) $(IMAGE_LAYOUT) $(IMG)

##@ Release

DIST := $(ROOT)/dist

# The worker image prefixes the admission policy allows (comma-separated);
# empty: IMG's repository, by digest only.
ALLOWED_IMAGE_PREFIXES ?=

.PHONY: build-installer
build-installer: image ## Render dist/install.yaml (namespace, CRD, RBAC, manager Deployment, admission policies) with the image IMG pinned by the digest of make image, and IMG's repository as the allowed worker image prefix (ALLOWED_IMAGE_PREFIXES overrides it): kubectl apply -f dist/install.yaml.
	@[ -n "$(IMG)" ] || { echo "make build-installer: set IMG=REGISTRY/REPOSITORY[:TAG], where make push sends the image"; exit 1; }
	ref=$$($(IMAGE_TOOL) ref $(IMAGE_LAYOUT) $(IMG)); \
	prefixes="$(ALLOWED_IMAGE_PREFIXES)"; prefixes="$${prefixes:-$${ref%@*}@sha256:}"; \
	rm -rf $(BIN)/installer && mkdir -p $(BIN)/installer $(DIST) && \
	printf '%s\n' "# Generated by make build-installer." \
		"apiVersion: kustomize.config.k8s.io/v1beta1" "kind: Kustomization" \
		"resources:" "- ../../config/default" \
		"images:" "- name: runledger" "  newName: $${ref%@*}" "  digest: $${ref#*@}" \
		"patches:" "- target: {kind: ConfigMap, name: runledger-worker-restrictions}" "  patch: |-" \
		"    - {op: replace, path: /data/allowedImagePrefixes, value: \"$${prefixes}\"}" >$(BIN)/installer/kustomization.yaml && \
	"$$($(ROOT)/hack/k8s-bins.sh --print-dir kubectl)/kubectl" kustomize $(BIN)/installer >$(DIST)/install.yaml.tmp && \
	mv $(DIST)/install.yaml.tmp $(DIST)/install.yaml && echo "$(DIST)/install.yaml: $$ref"

# make release: a tagged commit's artifacts, reproducibly (the same commit
# gives the same dist/SHA256SUMS, byte for byte: every date is the commit's).
RELEASE_TOOL := $(BIN)/cluster-tools/release
KUBECTL = $(shell $(ROOT)/hack/k8s-bins.sh --print-dir kubectl)/kubectl
RELEASE_ARTIFACTS := install.yaml install-namespaced.yaml crds.yaml runledger.cdx.json runledger.yaml
# The CLI as kubectl's plugin (kubectl runledger): an archive per platform,
# kubectl-runledger_OS_ARCH.tar.gz, and the krew manifest runledger.yaml
# that downloads them from RELEASE_URL (where the release's files are
# published: the GitHub release of VERSION by default).
PLUGIN_PLATFORMS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
RELEASE_URL ?= $(SOURCE_URL)/releases/download/$(VERSION)

.PHONY: release
release: ## make release VERSION=vX.Y.Z IMG=REGISTRY/REPOSITORY [INSECURE=1]: from a clean tree at the tag VERSION, push the image (multi-arch, tag VERSION) and write dist/: install.yaml, install-namespaced.yaml, crds.yaml, the chart runledger-X.Y.Z.tgz, the SBOM runledger.cdx.json (CycloneDX), the CLI as kubectl's plugin (kubectl-runledger_OS_ARCH.tar.gz for linux and darwin, amd64 and arm64) with its krew manifest runledger.yaml (downloading from RELEASE_URL, default the GitHub release of VERSION) and SHA256SUMS.
	@[[ "$(VERSION)" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$ ]] || { echo "make release: set VERSION=vMAJOR.MINOR.PATCH (got '$(VERSION)')"; exit 1; }
	@[[ "$(IMG)" =~ ^[^@]+$$ && ! "$(IMG)" =~ :[^/]*$$ && -n "$(IMG)" ]] || { echo "make release: set IMG=REGISTRY/REPOSITORY, without a tag (the release pushes REPOSITORY:$(VERSION))"; exit 1; }
	@cd $(ROOT) && [ -z "$$(git status --porcelain)" ] || { echo "make release: the tree is not clean (commit or stash first):"; git status --short; exit 1; }
	@cd $(ROOT) && [ "$$(git describe --exact-match --tags HEAD 2>/dev/null)" = "$(VERSION)" ] || { echo "make release: HEAD is not tagged $(VERSION) (git tag -a $(VERSION) -m $(VERSION))"; exit 1; }
	rm -rf $(DIST) $(BIN)/release && mkdir -p $(DIST) $(BIN)/release $(dir $(RELEASE_TOOL))
	cd $(ROOT)/hack/tools/release && GOWORK=off CGO_ENABLED=0 go build -trimpath -o $(RELEASE_TOOL) .
	$(MAKE) -s push IMG="$(IMG):$(VERSION)"
	ref=$$($(IMAGE_TOOL) ref $(IMAGE_LAYOUT) "$(IMG):$(VERSION)"); epoch=$$(git -C $(ROOT) log -1 --format=%ct); \
	for v in default:install.yaml namespaced:install-namespaced.yaml; do \
		mkdir -p $(BIN)/release/$${v%%:*} && \
		printf '%s\n' "# Generated by make release." \
			"apiVersion: kustomize.config.k8s.io/v1beta1" "kind: Kustomization" \
			"resources:" "- ../../../config/$${v%%:*}" \
			"images:" "- name: runledger" "  newName: $${ref%@*}" "  digest: $${ref#*@}" >$(BIN)/release/$${v%%:*}/kustomization.yaml && \
		$(KUBECTL) kustomize $(BIN)/release/$${v%%:*} >$(DIST)/$${v#*:}; \
	done; \
	$(KUBECTL) kustomize $(ROOT)/config/crd >$(DIST)/crds.yaml; \
	(cd $(ROOT)/hack/tools/helm && GOWORK=off go run . package -chart $(ROOT)/charts/runledger -version $(VERSION) -image "$$ref" -epoch "$$epoch" -o $(DIST)); \
	$(RELEASE_TOOL) sbom -o $(DIST)/runledger.cdx.json -image "$$ref" -version $(VERSION) -epoch "$$epoch" $(BIN)/platforms/*/runledger $(BIN)/platforms/*/runledger-worker; \
	plugins=(); for p in $(PLUGIN_PLATFORMS); do \
		out=$(BIN)/release/plugin/$${p//\//_}/kubectl-runledger; \
		CGO_ENABLED=0 GOOS=$${p%%/*} GOARCH=$${p#*/} go build -trimpath -ldflags "$(LDFLAGS)" -o $$out $(ROOT); \
		plugins+=("$$p=$$out"); \
	done; \
	$(RELEASE_TOOL) plugin -o $(DIST) -version $(VERSION) -epoch "$$epoch" -url "$(RELEASE_URL)" -homepage $(SOURCE_URL) \
		$(addprefix -file ,$(wildcard $(ROOT)/LICENSE)) "$${plugins[@]}"; \
	$(RELEASE_TOOL) sums -o $(DIST)/SHA256SUMS $(addprefix $(DIST)/,$(RELEASE_ARTIFACTS)) $(DIST)/runledger-*.tgz $(DIST)/kubectl-runledger_*.tar.gz; \
	echo "$$ref" >$(BIN)/release/image; \
	echo "make release $(VERSION): $$ref"; cat $(DIST)/SHA256SUMS

# Two make release, one of them cold, for six platforms' binaries: 35 minutes
# of wall time on a busy 2-core host, over GO_TEST_FLAGS' 30.
RELEASE_CHECK_TIMEOUT ?= 60m

.PHONY: release-check
release-check: ## make release twice, from two clean clones of HEAD (tagged v0.0.0-check there; the second with an empty Go build cache, or the shared one with RUNLEDGER_RELEASE_CHECK_CACHE=shared, as CI runs it), against a throwaway registry on loopback: the two SHA256SUMS must match byte for byte (hack/tools/release; 25 to 35 minutes on 2 cores, most of it the second clone's cold compile).
	cd $(ROOT)/hack/tools/release && RUNLEDGER_RELEASE_CHECK=$(ROOT) GOWORK=off go test $(GO_TEST_FLAGS) -timeout $(RELEASE_CHECK_TIMEOUT) -run '^TestReleaseReproducible$$' -v ./...

##@ Test

# The suites that send the ledger's statements, run again through a real
# PgBouncer in transaction mode (pgtest.EnvPooler; docs/poolers.md).
POOLER_SUITES := ./internal/ledger/... ./internal/worker/... ./test/cli/...

.PHONY: test
test: envtest-assets $(PROMTOOL) $(WEED) ## Run every test: unit, PostgreSQL integration, envtest (starts its own PostgreSQL and kube-apiserver), the object-store tests (a SeaweedFS S3 server of their own), the alerts through promtool test rules; the ledger, worker and CLI suites once more through PgBouncer (transaction mode).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" PROMTOOL="$(PROMTOOL)" RUNLEDGER_S3_WEED="$(WEED)" RUNLEDGER_S3_REQUIRE=1 \
		go test $(GO_TEST_FLAGS) ./...
	RUNLEDGER_TEST_POOLER=pgbouncer KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test $(GO_TEST_FLAGS) $(POOLER_SUITES)
	cd $(ROOT)/hack/tools/image && GOWORK=off go test $(GO_TEST_FLAGS) ./...
	cd $(ROOT)/hack/tools/pki && GOWORK=off go test $(GO_TEST_FLAGS) ./...
	cd $(ROOT)/hack/tools/release && GOWORK=off go test $(GO_TEST_FLAGS) ./...
	$(MAKE) -s chart-test

.PHONY: test-unit
test-unit: ## The fast loop while editing (about a minute warm): go test -short, the tests that need no server nor external binary (no PostgreSQL, PgBouncer, kube-apiserver, promtool, SeaweedFS); the chart's tests are make chart-test's. make test runs everything.
	go test -short -count=1 ./...
	cd $(ROOT)/hack/tools/image && GOWORK=off go test -short -count=1 ./...
	cd $(ROOT)/hack/tools/pki && GOWORK=off go test -short -count=1 ./...
	cd $(ROOT)/hack/tools/release && GOWORK=off go test -short -count=1 ./...

.PHONY: chart-test
chart-test: $(HELM) ## The Helm chart: its tests (the chart is config/default, values change what they say, reproducible package), helm lint --strict and helm template.
	cd $(ROOT)/hack/tools/helm && GOWORK=off go test $(GO_TEST_FLAGS) ./...
	$(HELM) lint --strict $(ROOT)/charts/runledger
	$(HELM) lint --strict $(ROOT)/charts/runledger --set watchNamespaces='{a,b}' \
		--set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true --set admissionPolicy.enabled=true
	$(HELM) template runledger $(ROOT)/charts/runledger --namespace runledger-system --include-crds >/dev/null

.PHONY: envtest-assets
envtest-assets: ## Build (once, cached under bin/k8s/) kube-apiserver, etcd and kubectl for envtest.
	$(ROOT)/hack/k8s-bins.sh kube-apiserver etcd kubectl

.PHONY: bench
bench: envtest-assets $(WEED) ## Benchmarks of the insert path and the worker (as its pods run it, reporting to envtest's kube-apiserver, and as runledger run) against their baselines, the worker with SQL effects and processors (0 and 20 ms a call) against the same run without and a processor against itself driven directly, the shard's proof against the run it ends, and a batch.object's fix against a plain client's read of the object; prints items/s, ratios and each shard's peak RSS (fsync on).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" RUNLEDGER_S3_WEED="$(WEED)" RUNLEDGER_S3_REQUIRE=1 \
		go test -run '^$$' -bench '^Benchmark(Ledger|Worker|WorkerEffects|Proof|ObjectFix)$$' -benchtime 1x -timeout 120m ./internal/bench/...

.PHONY: bench-growth
bench-growth: ## The worker's items/s on a ledger of 10M and 50M committed rows beside an empty one, month-style and random keys, with table and index sizes (about 50 minutes, 30 GB of disk; RUNLEDGER_BENCH_GROWTH_SHAPES=random for one shape, RUNLEDGER_BENCH_SHARED_BUFFERS=4GB for a production server's setting).
	go test -run '^$$' -bench '^BenchmarkGrowth$$' -benchtime 1x -timeout 120m ./internal/bench/...

.PHONY: bench-status
bench-status: envtest-assets ## API writes (run, pods, Events), reconciles and how far the counts are behind while 1, 16 and 256 shards report (envtest, the real manager), one reporter per run beside the protocol before.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test -run '^$$' -bench '^BenchmarkStatusWrites$$' -benchtime 1x -timeout 60m ./internal/bench/...

.PHONY: bench-runs
bench-runs: envtest-assets ## One manager, 10,000 runs (most finished): memory, reconcile p50/p99, reconciles and API requests/s, one reporter per run beside the protocol before (envtest, the real manager).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test -run '^$$' -bench '^BenchmarkManyRuns$$' -benchtime 1x -timeout 90m ./internal/bench/...

##@ Generate

# Generated from markers in api/ and controllers/; `make verify` fails when
# the committed copies differ.
GENERATED := api config/crd/bases config/rbac/role.yaml config/kueue/role.yaml charts/runledger

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD (config/crd/bases), the manager's ClusterRole (config/rbac/role.yaml) and its Kueue ClusterRole (config/kueue/role.yaml) from markers.
	rm -f $(ROOT)/config/crd/bases/*.yaml
	cd $(ROOT) && $(CONTROLLER_GEN) crd rbac:roleName=runledger-manager paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	cd $(ROOT) && $(CONTROLLER_GEN) rbac:roleName=runledger-manager-kueue paths=./internal/kueuerbac/... \
		output:rbac:artifacts:config=config/kueue

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy functions and server-side apply configurations of the API.
	rm -rf $(ROOT)/api/applyconfiguration
	cd $(ROOT) && $(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt \
		applyconfiguration:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: chart
chart: ## Generate charts/runledger (templates, crds/, values.yaml) from config/default, config/namespaced, config/prometheus and config/policy (hack/tools/helm).
	cd $(ROOT)/hack/tools/helm && GOWORK=off go run . generate -root $(ROOT) -o $(ROOT)/charts/runledger

.PHONY: verify
verify: manifests generate chart ## Regenerate and fail on any drift (changed or untracked generated files, go.mod not tidy).
	@cd $(ROOT) && if ! git diff --exit-code --stat -- $(GENERATED); then \
		echo "generated files are stale: run 'make manifests generate chart' and commit the result"; exit 1; fi
	@cd $(ROOT) && untracked=$$(git ls-files --others --exclude-standard -- $(GENERATED)); if [ -n "$$untracked" ]; then \
		echo "untracked generated files (commit them):"; echo "$$untracked"; exit 1; fi
	@cd $(ROOT) && go mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy: run 'go mod tidy'"; exit 1; }

##@ Code quality

.PHONY: lint
lint: $(GOLANGCI_LINT) $(GOCYCLO) shellcheck ## gofmt, go vet, golangci-lint (runledger, and the release tool's own module: it has logic), gocyclo (no function over $(GOCYCLO_OVER) outside tests and generated code) and shellcheck (every script, sourced parts followed).
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(GOLANGCI_LINT) run ./...
	cd $(ROOT)/hack/tools/release && GOWORK=off go vet ./... && GOWORK=off $(GOLANGCI_LINT) run ./...
	@cd $(ROOT) && out=$$($(GOCYCLO) -over $(GOCYCLO_OVER) $$(git ls-files '*.go' | grep -vE '_test\.go$$|zz_generated|/applyconfiguration/')); \
		if [ -n "$$out" ]; then echo "cyclomatic complexity over $(GOCYCLO_OVER) (split the function into named steps):"; echo "$$out"; exit 1; fi
	cd $(ROOT) && shellcheck --external-sources $$(git ls-files '*.sh' .ci/run)

.PHONY: fmt
fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go')

##@ Local cluster

NODES ?= 1

.PHONY: cluster-up
cluster-up: ## Start a Kubernetes cluster of NODES nodes (default 1) and PostgreSQL in network namespaces (root; hack/cluster.sh; the first run builds the binaries, ~15 min).
	$(ROOT)/hack/cluster.sh up --nodes $(NODES)

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and leave the host as it was found.
	$(ROOT)/hack/cluster.sh down

##@ Demo and end-to-end tests

.PHONY: demo
demo: ## Run runledger on a real local cluster: installs and builds what is missing (first time ~15 min), deploys the operator, then tells the story (hack/demo/story.sh: the ledger set up as docs/migrations.md says, runs with an SQL effect, the same keys again, a failed item retried, a schedule triggered twice) and prints what to try next (root; hack/demo.sh).
	$(ROOT)/hack/demo.sh

.PHONY: demo-down
demo-down: ## Stop the demo's cluster and leave the host as it was found.
	$(ROOT)/hack/demo.sh down

.PHONY: e2e
e2e: ## End-to-end tests on a real local cluster (root; hack/e2e.sh: up, deploy, go test -tags e2e, down, host check). E2E_ARGS='-run TestHappyPath' selects tests.
	$(ROOT)/hack/e2e.sh $(E2E_ARGS)

# make soak: DURATION of faults and runs (the drain and the checks follow),
# SEED of the generator and the nemesis (empty: a random one, printed),
# FAILOVERS=1 the ledger on an HA formation (pg_auto_failover) that the
# nemesis fails over too, FAILOVERS=0 on the cluster's PostgreSQL (the seeds
# kept before failovers, whose files have no "failovers": true).
DURATION ?= 10m
SEED ?=
FAILOVERS ?= 1

.PHONY: soak
soak: ## The soak on a real two-node cluster (root; hack/e2e.sh -run TestSoak): a stream of runs while a seeded nemesis injects faults (failovers of the HA ledger included; FAILOVERS=0 without), an independent checker, one summary (items/s, faults by kind, lost=0 double=0). make soak DURATION=10m SEED=N replays a seed.
	RUNLEDGER_SOAK_DURATION=$(DURATION) RUNLEDGER_SOAK_SEED=$(SEED) RUNLEDGER_SOAK_FAILOVERS=$(FAILOVERS) $(ROOT)/hack/e2e.sh -run '^TestSoak$$' -timeout 120m

##@ Tools

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)
	GOBIN=$(BIN)/.tmp-golangci go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.tmp-golangci/golangci-lint $@ && rmdir $(BIN)/.tmp-golangci

$(GOCYCLO):
	@mkdir -p $(BIN)
	GOBIN=$(BIN)/.tmp-gocyclo go install github.com/fzipp/gocyclo/cmd/gocyclo@$(GOCYCLO_VERSION)
	mv $(BIN)/.tmp-gocyclo/gocyclo $@ && rmdir $(BIN)/.tmp-gocyclo
.PHONY: promtool
promtool: $(PROMTOOL) ## Build the pinned promtool into bin/ (once).

$(PROMTOOL):
	@mkdir -p $(BIN)
	cd $(ROOT)/hack/tools/promtool && GOWORK=off CGO_ENABLED=0 go build -trimpath -o $@ github.com/prometheus/prometheus/cmd/promtool

$(CONTROLLER_GEN):
	@mkdir -p $(BIN)
	GOBIN=$(BIN)/.tmp-cgen go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(BIN)/.tmp-cgen/controller-gen $@ && rmdir $(BIN)/.tmp-cgen

.PHONY: weed
weed: $(WEED) ## Build the pinned SeaweedFS server (hack/tools/seaweedfs/go.mod) into bin/weed-VERSION: the S3-compatible store of the object-store tests (internal/s3test).

.PHONY: weed-path
weed-path: ## Print the path of the pinned weed binary, built or not (hack/cluster.sh runs it as the local cluster's S3 store).
	@echo $(WEED)

# Static, as SeaweedFS' own release builds; COMMIT stamped as its Makefile
# leaves to the builder (weed version prints it): the pseudo-version's hash.
$(WEED):
	@mkdir -p $(BIN)
	cd $(ROOT)/hack/tools/seaweedfs && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "-s -w \
		-X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT=$(lastword $(subst -, ,$(SEAWEEDFS_VERSION)))" \
		-o $@.tmp github.com/seaweedfs/seaweedfs/weed
	mv $@.tmp $@

.PHONY: helm
helm: $(HELM) ## Build the pinned helm (hack/tools/helm/go.mod) into bin/helm-VERSION.

# As helm's own Makefile stamps it: its version, and the Kubernetes version of
# its client-go (helm template and helm lint assume that cluster version).
HELM_K8S_MINOR = $(shell awk '$$1 == "k8s.io/client-go" { split($$2, v, "."); print v[2]; exit }' $(ROOT)/hack/tools/helm/go.mod)
$(HELM):
	@mkdir -p $(BIN)
	cd $(ROOT)/hack/tools/helm && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "-s -w \
		-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
		-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_K8S_MINOR) \
		-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_K8S_MINOR)" \
		-o $@.tmp helm.sh/helm/v3/cmd/helm
	mv $@.tmp $@

.PHONY: shellcheck
shellcheck: ## Install shellcheck $(SHELLCHECK_VERSION) with apt if missing; fail if the one on PATH is another version.
	@have() { shellcheck --version 2>/dev/null | awk '/^version:/ { print $$2 }'; }; \
	if [ "$$(have)" != "$(SHELLCHECK_VERSION)" ]; then \
		echo "installing shellcheck=$(SHELLCHECK_DEB_VERSION) (apt-get)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq --no-install-recommends shellcheck=$(SHELLCHECK_DEB_VERSION) >/dev/null 2>&1 || \
			{ apt-get update -qq && apt-get install -y -qq --no-install-recommends shellcheck=$(SHELLCHECK_DEB_VERSION) >/dev/null; }; \
	fi; \
	v="$$(have)"; [ "$$v" = "$(SHELLCHECK_VERSION)" ] || { echo "shellcheck $${v:-not found}, want $(SHELLCHECK_VERSION) (apt-get install shellcheck=$(SHELLCHECK_DEB_VERSION))"; exit 1; }

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
