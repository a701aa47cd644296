# runledger — build, test and tooling. Tools are pinned and installed under bin/.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
BIN := $(ROOT)/bin
export GOBIN := $(BIN)

GOLANGCI_LINT_VERSION := v2.15.0
CONTROLLER_TOOLS_VERSION := v0.23.0
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)

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
build: ## Build bin/runledger (static; VERSION and COMMIT default to git describe and the HEAD commit).
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/runledger .

##@ Image

# make image: an OCI image layout in bin/image (an index of one image per
# platform), built without a daemon by hack/tools/image; make push sends it.
PLATFORMS ?= linux/amd64 linux/arm64
IMG ?=
SOURCE_URL ?= https://github.com/runledger/runledger
IMAGE_TOOL := $(BIN)/cluster-tools/image
IMAGE_LAYOUT := $(BIN)/image

.PHONY: image
image: ## Build the runledger image into bin/image (OCI layout, no daemon): static binaries for PLATFORMS, no shell, user 65532, OCI labels; same commit, same digest.
	@mkdir -p $(dir $(IMAGE_TOOL))
	cd $(ROOT)/hack/tools/image && GOWORK=off CGO_ENABLED=0 go build -trimpath -o $(IMAGE_TOOL) .
	bins=(); for p in $(PLATFORMS); do \
		out=$(BIN)/platforms/$${p//\//_}/runledger; \
		CGO_ENABLED=0 GOOS=$${p%%/*} GOARCH=$${p#*/} go build -trimpath -ldflags "$(LDFLAGS)" -o $$out $(ROOT); \
		bins+=(-binary "$$p=$$out"); \
	done; \
	$(IMAGE_TOOL) build -o $(IMAGE_LAYOUT) "$${bins[@]}" -path /runledger \
		-label org.opencontainers.image.source=$(SOURCE_URL) \
		-label org.opencontainers.image.version=$(VERSION) \
		-label org.opencontainers.image.revision=$(COMMIT)

.PHONY: push
push: image ## Push the image: make push IMG=registry.example/runledger:TAG (credentials of ~/.docker/config.json; INSECURE=1 for plain HTTP); prints REPOSITORY@DIGEST.
	@[ -n "$(IMG)" ] || { echo "make push: set IMG=REGISTRY/REPOSITORY:TAG"; exit 1; }
	$(IMAGE_TOOL) push $(if $(INSECURE),-insecure) $(IMAGE_LAYOUT) $(IMG)

##@ Test

.PHONY: test
test: envtest-assets ## Run every test: unit, PostgreSQL integration, envtest (starts its own PostgreSQL and kube-apiserver).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test $(GO_TEST_FLAGS) ./...
	cd $(ROOT)/hack/tools/image && GOWORK=off go test $(GO_TEST_FLAGS) ./...

.PHONY: envtest-assets
envtest-assets: ## Build (once, cached under bin/k8s/) kube-apiserver, etcd and kubectl for envtest.
	$(ROOT)/hack/k8s-bins.sh kube-apiserver etcd kubectl

.PHONY: bench
bench: ## Benchmarks of the insert path against its baselines; prints items/s and ratios (fsync on).
	go test -run '^$$' -bench . -benchtime 1x -timeout 60m ./internal/bench/...

##@ Generate

# Generated from markers in api/ and controllers/; `make verify` fails when
# the committed copies differ.
GENERATED := api config/crd/bases config/rbac/role.yaml

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD (config/crd/bases) and the manager's ClusterRole (config/rbac/role.yaml) from markers.
	rm -f $(ROOT)/config/crd/bases/*.yaml
	cd $(ROOT) && $(CONTROLLER_GEN) crd rbac:roleName=runledger-manager paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy functions and server-side apply configurations of the API.
	rm -rf $(ROOT)/api/applyconfiguration
	cd $(ROOT) && $(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt \
		applyconfiguration:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: verify
verify: manifests generate ## Regenerate and fail on any drift (changed or untracked generated files, go.mod not tidy).
	@cd $(ROOT) && if ! git diff --exit-code --stat -- $(GENERATED); then \
		echo "generated files are stale: run 'make manifests generate' and commit the result"; exit 1; fi
	@cd $(ROOT) && untracked=$$(git ls-files --others --exclude-standard -- $(GENERATED)); if [ -n "$$untracked" ]; then \
		echo "untracked generated files (commit them):"; echo "$$untracked"; exit 1; fi
	@cd $(ROOT) && go mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy: run 'go mod tidy'"; exit 1; }

##@ Code quality

.PHONY: lint
lint: $(GOLANGCI_LINT) ## gofmt, go vet and golangci-lint.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(GOLANGCI_LINT) run ./...

.PHONY: fmt
fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go')

##@ Local cluster

.PHONY: cluster-up
cluster-up: ## Start a single-node Kubernetes cluster and PostgreSQL in a network namespace (root; hack/cluster.sh; the first run builds the binaries, ~15 min).
	$(ROOT)/hack/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and leave the host as it was found.
	$(ROOT)/hack/cluster.sh down

##@ Demo and end-to-end tests

.PHONY: demo
demo: ## Run runledger on a real local cluster: installs and builds what is missing (first time ~15 min), deploys the operator, runs the sample (root; hack/demo.sh).
	$(ROOT)/hack/demo.sh

.PHONY: demo-down
demo-down: ## Stop the demo's cluster and leave the host as it was found.
	$(ROOT)/hack/demo.sh down

.PHONY: e2e
e2e: ## End-to-end tests on a real local cluster (root; hack/e2e.sh: up, deploy, go test -tags e2e, down, host check). E2E_ARGS='-run TestHappyPath' selects tests.
	$(ROOT)/hack/e2e.sh $(E2E_ARGS)

##@ Tools

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)
	GOBIN=$(BIN)/.tmp-golangci go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.tmp-golangci/golangci-lint $@ && rmdir $(BIN)/.tmp-golangci

$(CONTROLLER_GEN):
	@mkdir -p $(BIN)
	GOBIN=$(BIN)/.tmp-cgen go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(BIN)/.tmp-cgen/controller-gen $@ && rmdir $(BIN)/.tmp-cgen

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
