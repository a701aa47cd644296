package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/yaml"
)

var (
	repoRoot = filepath.Join("..", "..", "..")
	chartDir = filepath.Join(repoRoot, "charts", "runledger")
)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	require.NoError(t, err)
	return c
}

// render is helm template: the chart's objects (CRDs included) by kind/name.
func render(t *testing.T, c *chart.Chart, namespace string, values map[string]any) map[string]obj {
	t.Helper()
	objs := map[string]obj{}
	for _, doc := range releaseutil.SplitManifests(manifest(t, c, namespace, values)) {
		var o obj
		require.NoError(t, yaml.Unmarshal([]byte(doc), &o), doc)
		if o == nil {
			continue
		}
		require.NotContains(t, objs, o.key(), "two objects %s", o.key())
		objs[o.key()] = normal(t, o)
	}
	return objs
}

// manifest is helm template --include-crds (the cluster of hack/cluster.sh's version).
func manifest(t *testing.T, c *chart.Chart, namespace string, values map[string]any) string {
	t.Helper()
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.IncludeCRDs = true
	install.ReleaseName, install.Namespace = "runledger", namespace
	kv, err := chartutil.ParseKubeVersion("v1.37.2")
	require.NoError(t, err)
	install.KubeVersion = kv
	rel, err := install.Run(c, values)
	require.NoError(t, err)
	return rel.Manifest
}

// normal is o as JSON decodes it, so that equal objects compare equal.
func normal(t *testing.T, o obj) obj {
	t.Helper()
	raw, err := json.Marshal(o)
	require.NoError(t, err)
	var n obj
	require.NoError(t, json.Unmarshal(raw, &n))
	return n
}

// built is the kustomize build of config/DIR by kind/name, without the
// Namespace (Helm installs into the release's: helm install --create-namespace).
func built(t *testing.T, dirs ...string) map[string]obj {
	t.Helper()
	objs := map[string]obj{}
	for _, d := range dirs {
		list, err := kustomize(filepath.Join(repoRoot, "config", d))
		require.NoError(t, err)
		for _, o := range list {
			if o.kind() != "Namespace" {
				objs[o.key()] = normal(t, o)
			}
		}
	}
	return objs
}

func sortedKeys(m map[string]obj) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// requireSame: the chart rendered the same objects as kustomize built.
func requireSame(t *testing.T, want, got map[string]obj) {
	t.Helper()
	require.Equal(t, sortedKeys(want), sortedKeys(got), "the chart renders the objects of config/")
	for k, w := range want {
		require.Equal(t, w, got[k], "%s differs between the chart and config/", k)
	}
}

// policyExample is config/policy's allowedImagePrefixes.
func policyExample(t *testing.T) string {
	t.Helper()
	for _, o := range built(t, "policy") {
		if o.kind() == "ConfigMap" {
			return o["data"].(map[string]any)["allowedImagePrefixes"].(string)
		}
	}
	t.Fatal("config/policy has no ConfigMap of parameters")
	return ""
}

// TestGeneratedUpToDate: charts/runledger is what make chart generates
// from config/ now (a change to config/ without make chart fails here).
func TestGeneratedUpToDate(t *testing.T) {
	s, err := loadSources(repoRoot)
	require.NoError(t, err)
	files, err := generate(s)
	require.NoError(t, err)
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(chartDir, name))
		require.NoError(t, err, "run make chart")
		require.Equal(t, want, string(got), "%s is stale: run make chart", name)
	}
	for _, sub := range []string{"templates", "crds"} {
		entries, err := os.ReadDir(filepath.Join(chartDir, sub))
		require.NoError(t, err)
		for _, e := range entries {
			raw, err := os.ReadFile(filepath.Join(chartDir, sub, e.Name()))
			require.NoError(t, err)
			if bytes.HasPrefix(raw, []byte(generatedHeader)) {
				require.Contains(t, files, sub+"/"+e.Name(), "a generated file config/ no longer makes: run make chart")
			}
		}
	}
}

// TestChartIsConfigDefault: with its default values the chart installs
// exactly config/default's objects (the CRDs from crds/), but the Namespace.
func TestChartIsConfigDefault(t *testing.T) {
	got := render(t, loadChart(t), systemNamespace, map[string]any{
		"admissionPolicy": map[string]any{"allowedImagePrefixes": policyExample(t)},
	})
	requireSame(t, built(t, "default"), got)
}

// TestChartIsConfigNamespaced: watchNamespaces=[the release's namespace]
// is config/namespaced (which names its namespace through the downward API).
func TestChartIsConfigNamespaced(t *testing.T) {
	got := render(t, loadChart(t), namespacedNamespace, map[string]any{
		"watchNamespaces": []any{namespacedNamespace},
		"admissionPolicy": map[string]any{"allowedImagePrefixes": policyExample(t)},
	})
	want := built(t, "namespaced")
	dep := want["Deployment/"+managerName]
	c := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	args := c["args"].([]any)
	require.Equal(t, "--watch-namespaces=$(POD_NAMESPACE)", args[len(args)-1])
	args[len(args)-1] = "--watch-namespaces=" + namespacedNamespace
	requireSame(t, want, got)
}

// TestChartIsConfigPrometheusAndPolicy: the metrics and policy values add
// config/prometheus' and config/policy's objects, as they are there.
func TestChartIsConfigPrometheusAndPolicy(t *testing.T) {
	got := render(t, loadChart(t), systemNamespace, map[string]any{
		"metrics": map[string]any{
			"serviceMonitor": map[string]any{"enabled": true},
			"prometheusRule": map[string]any{"enabled": true},
		},
		"admissionPolicy": map[string]any{"enabled": true, "allowedImagePrefixes": policyExample(t)},
	})
	requireSame(t, built(t, "prometheus", "policy"), got)
}

// TestChartIsConfigKueue: kueue.enabled is config/kueue (the manager's
// --kueue and its Kueue ClusterRole, bound; Kueue's manager's right to read
// runs), and kueue.controllerServiceAccount changes only that right's
// subject.
func TestChartIsConfigKueue(t *testing.T) {
	c := loadChart(t)
	got := render(t, c, systemNamespace, map[string]any{
		"kueue":           map[string]any{"enabled": true},
		"admissionPolicy": map[string]any{"allowedImagePrefixes": policyExample(t)},
	})
	requireSame(t, built(t, "kueue"), got)

	other := render(t, c, systemNamespace, map[string]any{
		"kueue":           map[string]any{"enabled": true, "controllerServiceAccount": map[string]any{"name": "kueue-manager", "namespace": "queues"}},
		"admissionPolicy": map[string]any{"allowedImagePrefixes": policyExample(t)},
	})
	const binding = "ClusterRoleBinding/runledger-kueue-reader"
	require.Equal(t, []any{map[string]any{"kind": "ServiceAccount", "name": "kueue-manager", "namespace": "queues"}}, other[binding]["subjects"])
	other[binding]["subjects"] = got[binding]["subjects"]
	requireSame(t, got, other)
}

func deployment(t *testing.T, objs map[string]obj) (pod, container map[string]any) {
	t.Helper()
	d, ok := objs["Deployment/"+managerName]
	require.True(t, ok)
	pod = d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	return pod, pod["containers"].([]any)[0].(map[string]any)
}

func fromYAML(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(s), &m))
	return m
}

// TestChartValues: every value changes what it says, and only that.
func TestChartValues(t *testing.T) {
	c := loadChart(t)
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

	t.Run("image by digest, tag, appVersion", func(t *testing.T) {
		_, ctr := deployment(t, render(t, c, "ops", fromYAML(t, "image: {repository: reg.example/rl, tag: v9, digest: "+digest+"}")))
		require.Equal(t, "reg.example/rl@"+digest, ctr["image"])
		_, ctr = deployment(t, render(t, c, "ops", fromYAML(t, "image: {repository: reg.example/rl, tag: v9}")))
		require.Equal(t, "reg.example/rl:v9", ctr["image"])
		_, ctr = deployment(t, render(t, c, "ops", fromYAML(t, "image: {repository: reg.example/rl, tag: ''}")))
		require.Equal(t, "reg.example/rl:"+c.Metadata.AppVersion, ctr["image"])
	})
	t.Run("replicas and resources", func(t *testing.T) {
		// Helm merges maps with the defaults: null removes a default.
		objs := render(t, c, "ops", fromYAML(t, "replicaCount: 3\nresources: {requests: {cpu: 1, memory: 1Gi}, limits: null}"))
		require.EqualValues(t, 3, objs["Deployment/"+managerName]["spec"].(map[string]any)["replicas"])
		_, ctr := deployment(t, objs)
		// The default ephemeral-storage request stays unless nulled too.
		require.Equal(t, map[string]any{"requests": map[string]any{"cpu": float64(1), "memory": "1Gi", "ephemeral-storage": "64Mi"}}, ctr["resources"])
		_, ctr = deployment(t, render(t, c, "ops", fromYAML(t, "resources: {requests: {cpu: 1, memory: 1Gi, ephemeral-storage: null}, limits: null}")))
		require.Equal(t, map[string]any{"requests": map[string]any{"cpu": float64(1), "memory": "1Gi"}}, ctr["resources"])
	})
	t.Run("placement", func(t *testing.T) {
		pod, _ := deployment(t, render(t, c, "ops", fromYAML(t, `
nodeSelector: {pool: system}
tolerations: [{key: dedicated, operator: Equal, value: system, effect: NoSchedule}]
affinity: null
topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]
priorityClassName: system-cluster-critical
`)))
		require.Equal(t, map[string]any{"pool": "system"}, pod["nodeSelector"])
		require.Len(t, pod["tolerations"], 1)
		require.Len(t, pod["topologySpreadConstraints"], 1)
		require.Equal(t, "system-cluster-critical", pod["priorityClassName"])
		require.NotContains(t, pod, "affinity", "affinity: null drops the default anti-affinity")
		pod, _ = deployment(t, render(t, c, "ops", nil))
		for _, k := range []string{"nodeSelector", "tolerations", "topologySpreadConstraints", "priorityClassName"} {
			require.NotContains(t, pod, k, "unset by default")
		}
		require.Contains(t, pod, "affinity", "config/default's anti-affinity by default")
	})
	t.Run("watched namespaces", func(t *testing.T) {
		docs := renderDocs(t, c, "ops", fromYAML(t, "watchNamespaces: [billing, payroll]"))
		objs := map[string]obj{}
		for _, o := range docs {
			objs[o.key()] = normal(t, o)
		}
		_, ctr := deployment(t, objs)
		args := ctr["args"].([]any)
		require.Equal(t, "--watch-namespaces=billing,payroll", args[len(args)-1])
		require.NotContains(t, objs, "ClusterRole/"+managerName, "no cluster-wide rights")
		require.NotContains(t, objs, "ClusterRoleBinding/"+managerName)
		require.Contains(t, objs, "ClusterRole/runledger-manager-nodes", "nodes stay cluster-wide")
		var roles, bindings []string
		for _, doc := range docs {
			switch {
			case doc.key() == "Role/"+managerName:
				roles = append(roles, doc.meta()["namespace"].(string))
			case doc.key() == "RoleBinding/"+managerName:
				bindings = append(bindings, doc.meta()["namespace"].(string))
				sub := doc["subjects"].([]any)[0].(map[string]any)
				require.Equal(t, "ops", sub["namespace"], "the manager's ServiceAccount is in the release's namespace")
			}
		}
		require.Equal(t, []string{"billing", "payroll"}, roles)
		require.Equal(t, []string{"billing", "payroll"}, bindings)
	})
	t.Run("the workers' database address", func(t *testing.T) {
		_, ctr := deployment(t, render(t, c, "ops", fromYAML(t, "networkPolicy: {databaseCIDRs: [10.20.0.0/16, 10.30.0.5/32], databasePorts: [6432]}")))
		args := ctr["args"].([]any)
		require.Equal(t, []any{"--worker-database-cidrs=10.20.0.0/16,10.30.0.5/32", "--worker-database-ports=6432"}, args[len(args)-2:])
		_, ctr = deployment(t, render(t, c, "ops", nil))
		for _, a := range ctr["args"].([]any) {
			require.NotContains(t, a, "--worker-database", "the manager's defaults unless set")
		}
		require.Contains(t, render(t, c, "ops", nil), "NetworkPolicy/runledger-manager")
	})
	t.Run("the runs' connection budget", func(t *testing.T) {
		_, ctr := deployment(t, render(t, c, "ops", fromYAML(t, "runMaxConnections: {default: 16, maximum: 64}")))
		args := ctr["args"].([]any)
		require.Equal(t, []any{"--run-max-connections-default=16", "--run-max-connections-maximum=64"}, args[len(args)-2:])
		_, ctr = deployment(t, render(t, c, "ops", fromYAML(t, "runMaxConnections: {maximum: 100000}")))
		args = ctr["args"].([]any)
		require.Equal(t, "--run-max-connections-maximum=100000", args[len(args)-1], "a large number stays an integer")
		_, ctr = deployment(t, render(t, c, "ops", nil))
		for _, a := range ctr["args"].([]any) {
			require.NotContains(t, a, "--run-max-connections", "no budget unless set")
		}
	})
	t.Run("metrics", func(t *testing.T) {
		objs := render(t, c, "ops", fromYAML(t, "metrics: {serviceMonitor: {enabled: true, labels: {release: kube-prometheus}}}"))
		sm := objs["ServiceMonitor/runledger-manager"]
		require.NotNil(t, sm)
		require.Equal(t, "kube-prometheus", sm.meta()["labels"].(map[string]any)["release"])
		require.Equal(t, "ops", sm.meta()["namespace"])
		require.NotContains(t, objs, "PrometheusRule/runledger")
		objs = render(t, c, "ops", fromYAML(t, "metrics: {prometheusRule: {enabled: true}}"))
		require.Contains(t, objs, "PrometheusRule/runledger")
		require.NotContains(t, objs, "ServiceMonitor/runledger-manager")
	})
	t.Run("admission policy", func(t *testing.T) {
		objs := render(t, c, "ops", fromYAML(t, "image: {repository: reg.example/rl, digest: "+digest+"}\nadmissionPolicy: {enabled: true}"))
		params := objs["ConfigMap/runledger-worker-restrictions"]
		require.NotNil(t, params)
		require.Equal(t, "reg.example/rl@sha256:", params["data"].(map[string]any)["allowedImagePrefixes"], "the chart's own image by default")
		b := objs["ValidatingAdmissionPolicyBinding/runledger-worker-restrictions"]
		require.Equal(t, "ops", b["spec"].(map[string]any)["paramRef"].(map[string]any)["namespace"])
		objs = render(t, c, "ops", fromYAML(t, "admissionPolicy: {enabled: true, allowedImagePrefixes: 'a/b@sha256:,c/d@sha256:'}"))
		require.Equal(t, "a/b@sha256:,c/d@sha256:", objs["ConfigMap/runledger-worker-restrictions"]["data"].(map[string]any)["allowedImagePrefixes"])
		objs = render(t, c, "ops", fromYAML(t, "admissionPolicy: {enabled: false}"))
		for k := range objs {
			require.NotContains(t, k, "ValidatingAdmissionPolicy", "disabled")
		}
	})
	t.Run("every object in the release's namespace", func(t *testing.T) {
		for k, o := range render(t, c, "ops", nil) {
			if ns, ok := o.meta()["namespace"]; ok {
				require.Equal(t, "ops", ns, k)
			}
		}
	})
}

// renderDocs: the rendered objects in order (several may share a kind/name).
func renderDocs(t *testing.T, c *chart.Chart, namespace string, values map[string]any) []obj {
	t.Helper()
	var out []obj
	for _, k := range sortedManifests(releaseutil.SplitManifests(manifest(t, c, namespace, values))) {
		var o obj
		require.NoError(t, yaml.Unmarshal([]byte(k), &o))
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

// sortedManifests: SplitManifests' map in document order (manifest-0, -1, ...).
func sortedManifests(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if len(keys[i]) != len(keys[j]) {
			return len(keys[i]) < len(keys[j])
		}
		return keys[i] < keys[j]
	})
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

// TestChartLint is helm lint --strict of the chart, with its default
// values and with every optional part on.
func TestChartLint(t *testing.T) {
	for _, vals := range []map[string]any{
		nil,
		fromYAML(t, "watchNamespaces: [a, b]\nmetrics: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}}\nadmissionPolicy: {enabled: true}"),
	} {
		lint := action.NewLint()
		lint.Strict = true
		res := lint.Run([]string{chartDir}, vals)
		require.Empty(t, res.Errors, "helm lint: %v", res.Messages)
	}
}

// TestPackageReproducible: make release's chart archive is the same bytes
// each time, with the release's version and image pinned.
func TestPackageReproducible(t *testing.T) {
	ref := "reg.example/rl@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	epoch := time.Unix(1700000000, 0)
	var archives [][]byte
	for range 2 {
		dir := t.TempDir()
		p, err := packageChart(chartDir, "v1.2.3", ref, epoch, dir)
		require.NoError(t, err)
		require.Equal(t, "runledger-1.2.3.tgz", filepath.Base(p))
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		archives = append(archives, raw)
		time.Sleep(1100 * time.Millisecond) // Helm dates its entries now
	}
	require.Equal(t, archives[0], archives[1], "the same chart, the same bytes")

	c, err := loader.LoadArchive(bytes.NewReader(archives[0]))
	require.NoError(t, err)
	require.Equal(t, "1.2.3", c.Metadata.Version)
	require.Equal(t, "v1.2.3", c.Metadata.AppVersion)
	_, ctr := deployment(t, render(t, c, "ops", nil))
	require.Equal(t, ref, ctr["image"], "the release's chart runs its image by digest")

	zr, err := gzip.NewReader(bytes.NewReader(archives[0]))
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		require.True(t, h.ModTime.Equal(epoch), "%s dated %s", h.Name, h.ModTime)
		require.True(t, strings.HasPrefix(h.Name, "runledger/"), h.Name)
	}

	_, err = packageChart(chartDir, "1.2.3", ref, epoch, t.TempDir())
	require.ErrorContains(t, err, "want vMAJOR.MINOR.PATCH")
	_, err = packageChart(chartDir, "v1.2.3", "reg.example/rl:v1.2.3", epoch, t.TempDir())
	require.ErrorContains(t, err, "want REPOSITORY@sha256:DIGEST")
}
