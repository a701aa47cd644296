package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestWorkerBinaryDeps: the worker binary links none of the manager's
// libraries, whose package initialisation and pages made most of a shard's
// memory (docs/scale.md): no controller-runtime, no client-go (its scheme
// of every API group), no CEL nor the API server's validation (the run's
// file was validated by the API server), no Prometheus, no protobuf.
func TestWorkerBinaryDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/runledger/runledger/cmd/runledger-worker").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	forbidden := []string{
		"sigs.k8s.io/controller-runtime/", "k8s.io/client-go/", "github.com/google/cel-go/", "cel.dev/",
		"k8s.io/apiextensions-apiserver/pkg/apiserver/", "k8s.io/apiserver/", "k8s.io/kube-openapi/pkg/validation/",
		"github.com/prometheus/", "google.golang.org/protobuf/", "sigs.k8s.io/kueue/", "go.uber.org/zap",
		"github.com/runledger/runledger/controllers", "github.com/runledger/runledger/internal/admission",
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(d+"/", f) {
				t.Errorf("the worker binary links %s (%s...)", d, f)
			}
		}
		if d == "github.com/runledger/runledger/internal/cli" {
			t.Errorf("the worker binary links %s, the manager's command line: only its exitcode and workercmd", d)
		}
	}
	for _, want := range []string{"github.com/jackc/pgx/v5", "github.com/runledger/runledger/internal/worker", "github.com/runledger/runledger/internal/ledger"} {
		if !slices.Contains(deps, want) {
			t.Errorf("the worker binary does not link %s: is this the worker?", want)
		}
	}
	if t.Failed() {
		t.Logf("go list -deps:\n%s", out)
	}
}
