package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
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
		// Strict: a key given twice is refused (yaml.YAMLToJSON keeps the
		// last), invalid UTF-8 and lone surrogate escapes are the parser's.
		if _, err := yaml.YAMLToJSON(raw); err != nil {
			return nil, fmt.Errorf("%s: document %d is not a Kubernetes object: %w", m.source, doc, err)
		}
		j, err := yaml.YAMLToJSONStrict(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", m.source, doc, err)
		}
		if err := exactNumbers(raw); err != nil {
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

// exactNumbers refuses a number of the document (a payload's, say) that
// its conversion to JSON would not keep as written: an integer beyond 64
// bits or a decimal with more digits than a float64 holds is rounded to the
// nearest float64, one beyond its range becomes a string. A trailing zero or
// another spelling of the same value is kept (it is the same JSON value).
func exactNumbers(raw []byte) error {
	var root yamlv3.Node
	if err := yamlv3.Unmarshal(raw, &root); err != nil {
		return nil //nolint:nilerr // the strict conversion before this one reports what does not parse
	}
	var walk func(n *yamlv3.Node) error
	walk = func(n *yamlv3.Node) error {
		if n.Kind == yamlv3.ScalarNode && !keepsAsJSON(n) {
			return fmt.Errorf("line %d: the number %s would not be kept as written (JSON holds it as a 64-bit integer or float, rounded); quote it to pass it as a string", n.Line, n.Value)
		}
		for _, c := range n.Content {
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(&root)
}

// keepsAsJSON reports whether the YAML scalar n, if a number (or a plain
// scalar that spells one beyond a float64's range, which the conversion
// makes a string), becomes a JSON number of the same value.
func keepsAsJSON(n *yamlv3.Node) bool {
	clean := strings.ReplaceAll(strings.TrimPrefix(n.Value, "+"), "_", "")
	switch {
	case n.Tag == "!!str" && n.Style == 0:
		_, err := strconv.ParseFloat(clean, 64)
		return !errors.Is(err, strconv.ErrRange)
	case n.Tag == "!!int":
		_, err := strconv.ParseInt(clean, 0, 64)
		return err == nil
	case n.Tag != "!!float":
		return true
	}
	switch strings.ToLower(strings.TrimLeft(clean, "-")) {
	case ".inf", ".nan":
		return true // not JSON at all: the conversion refuses it itself
	}
	f, err := strconv.ParseFloat(clean, 64)
	if err != nil {
		return false
	}
	written, ok := new(big.Rat).SetString(clean)
	kept, ok2 := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	return ok && ok2 && written.Cmp(kept) == 0
}
