package v1alpha1

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// workerWrites is a description claiming that a worker writes the run's
// status, which the contract says it never does.
var workerWrites = regexp.MustCompile(`(?i)\b(written|set|owned|updated|patched|wrote)\s+(by|into)\s+((the|each|a|its)\s+)?(shard's\s+)?workers?\b|\band\s+by\s+(the|each)\s+workers?\b|\bworkers?\s+(writes?|owns?|wrote)\s+(this|its|their|the)\b`)

// statusSchema is the status schema of the generated CRD, the text users
// read with kubectl explain.
func statusSchema(t *testing.T) apiextensionsv1.JSONSchemaProps {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", Group+"_processingruns.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == GroupVersion.Version {
			return v.Schema.OpenAPIV3Schema.Properties["status"]
		}
	}
	t.Fatalf("the CRD has no version %s", GroupVersion.Version)
	return apiextensionsv1.JSONSchemaProps{}
}

// TestCRDDescriptionsMatchContract: the CRD's status descriptions say who
// writes what as contract.go declares it: the controller writes the whole
// status, no description says a worker writes it, and each field of a
// shard's entry names its source (StatusSources) — the controller's own
// decision or the worker's report.
func TestCRDDescriptionsMatchContract(t *testing.T) {
	status := statusSchema(t)
	if !strings.Contains(status.Description, "controller") {
		t.Errorf("status: the description does not name the controller as its writer: %q", status.Description)
	}
	var walk func(path string, p apiextensionsv1.JSONSchemaProps)
	walk = func(path string, p apiextensionsv1.JSONSchemaProps) {
		if workerWrites.MatchString(p.Description) {
			t.Errorf("%s: the description says a worker writes it, the contract says only the controller does: %q", path, p.Description)
		}
		for name, c := range p.Properties {
			walk(path+"."+name, c)
		}
		if p.Items != nil && p.Items.Schema != nil {
			walk(path+"[]", *p.Items.Schema)
		}
	}
	walk("status", status)

	shard := status.Properties["shards"].Items.Schema.Properties
	var fields []string
	for name := range shard {
		fields = append(fields, name)
	}
	sort.Strings(fields)
	for _, name := range fields {
		src, ok := StatusSources[name]
		desc := shard[name].Description
		switch {
		case !ok:
			t.Errorf("status.shards[].%s: not in StatusSources: declare where it comes from", name)
		case src == FromController && !strings.Contains(desc, "controller"):
			t.Errorf("status.shards[].%s: the contract says the controller decides it, the description does not say so: %q", name, desc)
		case src == FromWorkerReport && !strings.Contains(desc, "report"):
			t.Errorf("status.shards[].%s: the contract says it is the worker's report, the description does not say so: %q", name, desc)
		}
	}
	for name := range StatusSources {
		if _, ok := shard[name]; !ok {
			t.Errorf("StatusSources names %q, which status.shards[] does not have", name)
		}
	}
}
