package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/admission"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/worker"
)

// batchInput is a run's manifest (-f) and its ConfigMap's items
// (--from-file), as runledger run and runledger items read them.
type batchInput struct {
	file, fromFile string
	stdin          io.Reader
}

// plan reads the manifest and its batch; the error carries the exit code.
func (o *batchInput) plan(ctx context.Context) (*manifest, *worker.Plan, error) {
	m, err := readManifest(o.file, o.stdin)
	if err != nil {
		return nil, nil, exitcode.BadInput(err)
	}
	if o.fromFile == "-" && o.file == "-" {
		return nil, nil, exitcode.BadInput(errors.New("--from-file - and -f - cannot both read stdin"))
	}
	plan, err := worker.NewPlan(ctx, m.run, o.batchData(m), worker.Limits{})
	if err != nil {
		return nil, nil, exitcode.For(err)
	}
	return m, plan, nil
}

// batchData resolves a configMapRef: --from-file, else a ConfigMap of that
// name in the manifest.
func (o *batchInput) batchData(m *manifest) worker.BatchData {
	return func(_ context.Context, ref v1alpha1.ConfigMapKeyRef) ([]byte, string, error) {
		if o.fromFile != "" {
			var data []byte
			var err error
			if o.fromFile == "-" {
				data, err = io.ReadAll(o.stdin)
			} else {
				data, err = os.ReadFile(o.fromFile)
			}
			if err != nil {
				return nil, "", &worker.InputError{Where: "reading --from-file:", Msg: err.Error()}
			}
			return data, "JSON Lines file " + o.fromFile, nil
		}
		for _, cm := range m.configMaps {
			if cm.Name != ref.Name || (cm.Namespace != "" && cm.Namespace != m.run.Namespace) {
				continue
			}
			if v, ok := cm.Data[ref.Key]; ok {
				return []byte(v), fmt.Sprintf("ConfigMap %s key %s", ref.Name, ref.Key), nil
			}
			if v, ok := cm.BinaryData[ref.Key]; ok {
				return v, fmt.Sprintf("ConfigMap %s key %s", ref.Name, ref.Key), nil
			}
			return nil, "", &worker.InputError{Where: "spec.batch.configMapRef:", Msg: fmt.Sprintf("ConfigMap %s in %s has no key %q", ref.Name, m.source, ref.Key)}
		}
		return nil, "", &worker.InputError{Where: "spec.batch.configMapRef:", Msg: fmt.Sprintf("no ConfigMap %s in %s; pass the items with --from-file FILE.jsonl, or add the ConfigMap to the manifest", ref.Name, m.source)}
	}
}

// manifestDecoder decodes a ProcessingRun from YAML or JSON, strictly.
var manifestDecoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
}()

// manifest is what `runledger run` reads: one ProcessingRun and any
// ConfigMaps (for a configMapRef), in one YAML or JSON stream.
type manifest struct {
	source     string
	run        *v1alpha1.ProcessingRun
	configMaps []corev1.ConfigMap
	// status is the run's status as the manifest holds it (kubectl get -o
	// yaml prints it; admission drops it from run): nil without one.
	status *v1alpha1.ProcessingRunStatus
}

func readManifest(path string, stdin io.Reader) (*manifest, error) {
	m := &manifest{source: path}
	var r io.Reader
	if path == "-" {
		m.source, r = "stdin", stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("reading manifest: %w", err)
		}
		defer f.Close()
		r = f
	}
	yr := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var runs []string
	for doc := 1; ; doc++ {
		raw, err := yr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", m.source, doc, err)
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		// kubectl apply's conversion (YAML 1.1; invalid UTF-8 and lone
		// surrogate escapes are its parser's errors), and asWritten refuses
		// what it would not keep as written: a key given twice among them.
		j, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d is not a Kubernetes object: %w", m.source, doc, err)
		}
		if err := asWritten(raw); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", m.source, doc, err)
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(j, &tm); err != nil {
			return nil, fmt.Errorf("%s: document %d is not a Kubernetes object: %w", m.source, doc, err)
		}
		switch {
		case tm.Kind == "ProcessingRun":
			if tm.APIVersion != v1alpha1.GroupVersion.String() {
				return nil, fmt.Errorf("%s: document %d: apiVersion %q: want %s", m.source, doc, tm.APIVersion, v1alpha1.GroupVersion)
			}
			run, err := admitRun(j)
			if err != nil {
				return nil, fmt.Errorf("%s: document %d (ProcessingRun): %w", m.source, doc, err)
			}
			m.run = run
			runs = append(runs, run.Name)
			var withStatus struct {
				Status *v1alpha1.ProcessingRunStatus `json:"status"`
			}
			if err := json.Unmarshal(j, &withStatus); err != nil {
				return nil, fmt.Errorf("%s: document %d (ProcessingRun): status: %w", m.source, doc, err)
			}
			m.status = withStatus.Status
		case tm.Kind == "ConfigMap" && tm.APIVersion == "v1":
			var cm corev1.ConfigMap
			if err := json.Unmarshal(j, &cm); err != nil {
				return nil, fmt.Errorf("%s: document %d (ConfigMap): %w", m.source, doc, err)
			}
			m.configMaps = append(m.configMaps, cm)
		case tm.Kind == "":
			return nil, fmt.Errorf("%s: document %d has no kind (want kind: ProcessingRun)", m.source, doc)
		}
		// Other kinds (a Secret, a Namespace) are for kubectl; not ours.
	}
	switch len(runs) {
	case 0:
		return nil, fmt.Errorf("%s holds no ProcessingRun (apiVersion: %s, kind: ProcessingRun)", m.source, v1alpha1.GroupVersion)
	case 1:
		return m, nil
	}
	return nil, fmt.Errorf("%s holds %d ProcessingRuns (%s): runledger run takes one", m.source, len(runs), strings.Join(runs, ", "))
}

// admitRun decodes a ProcessingRun document (as JSON) and checks it as the
// apiserver checks a run it creates, with the CRD's own schema, CEL rules
// and defaults, so that runledger run accepts exactly the manifests a
// cluster accepts.
func admitRun(j []byte) (*v1alpha1.ProcessingRun, error) {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(j); err != nil { // integers as int64, as the apiserver decodes them
		return nil, err
	}
	if u.GetNamespace() == "" {
		u.SetNamespace("default") // as kubectl does with a context without a namespace
	}
	v, err := admission.ProcessingRun()
	if err != nil {
		return nil, err
	}
	if u.GetName() == "" && u.GetGenerateName() != "" { // the apiserver would make one up
		return nil, errors.New("metadata.name: Required value: runledger run needs a name, not a generateName: it names the run in the ledger and derives its identity")
	}
	if err := v.Create(context.Background(), u.Object); err != nil {
		return nil, err
	}
	defaulted, err := u.MarshalJSON()
	if err != nil {
		return nil, err
	}
	run := &v1alpha1.ProcessingRun{}
	// Strict: a field the schema had but the Go type lacks must not be
	// silently dropped either.
	if _, _, err := manifestDecoder.Decode(defaulted, nil, run); err != nil {
		return nil, err
	}
	return run, nil
}

// stripComments drops YAML comment lines, to tell an empty document apart.
func stripComments(b []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' && !bytes.Equal(t, []byte("---")) {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}
