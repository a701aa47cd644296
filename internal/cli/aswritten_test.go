package cli

import (
	"encoding/json"
	"fmt"
	"regexp"
	"testing"
	"time"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// yaml12JSON is doc as go.yaml.in/yaml/v3 reads it (YAML 1.2's core schema,
// but for its YAML 1.1 leftovers: 010, 0b1, 1_000, which asWritten
// refuses), as JSON; false when it holds a timestamp, which v3 reads as a
// time and YAML 1.1 as kubectl reads it keeps as its text.
func yaml12JSON(t *testing.T, doc string) ([]byte, bool) {
	t.Helper()
	var v any
	if err := yamlv3.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("%q accepted, go.yaml.in/yaml/v3 refuses it: %v", doc, err)
	}
	var conv func(v any) (any, bool)
	conv = func(v any) (any, bool) {
		switch x := v.(type) {
		case time.Time:
			return nil, false
		case []any:
			for i := range x {
				var ok bool
				if x[i], ok = conv(x[i]); !ok {
					return nil, false
				}
			}
		case map[string]any:
			for k := range x {
				var ok bool
				if x[k], ok = conv(x[k]); !ok {
					return nil, false
				}
			}
		case map[any]any:
			m := map[string]any{}
			for k, e := range x {
				var ok bool
				if _, ok = k.(time.Time); ok {
					return nil, false
				}
				if m[fmt.Sprint(k)], ok = conv(e); !ok {
					return nil, false
				}
			}
			return m, true
		}
		return v, true
	}
	v, ok := conv(v)
	if !ok {
		return nil, false
	}
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%q accepted, YAML 1.2 reads it as no JSON: %v", doc, err)
	}
	return j, true
}

// nonSpecificTag is a "!" tag, which go.yaml.in/yaml/v3 ignores.
var nonSpecificTag = regexp.MustCompile(`(^|[\s\[{,:?-])!($|[\s,\]}])`)

// FuzzAsWritten: a document asWritten accepts is read alike by YAML 1.1 as
// kubectl reads it (sigs.k8s.io/yaml) and by YAML 1.2 (go.yaml.in/yaml/v3):
// every scalar, key, merge and number as written.
func FuzzAsWritten(f *testing.F) {
	for _, s := range []string{
		"{n: 16, o: 010, flag: yes}", "a: [y, Y, yes, on, Off, NO, n]", "{true: 1, \"true\": 2}", "{1: a, \"1\": b}",
		"a: &a {k: 1, l: 2}\nb:\n  <<: *a\n  k: 9\n", "a: &a {k: 1}\nb:\n  k: 9\n  <<: *a\n", "a: &a {k: 1}\nc: &c {k: 2}\nb: {<<: [*a, *c]}\n",
		"{a: {<<: {k: 1}, <<: {l: 2}}}", "x: [0o17, 0x1F, 08, 1.10, .5, +1, 1e3, -0, 1., 09.5, 0O17, 0X1F, 1_000, 0b11, -0b11, 1_, +0x1F]",
		"{1:20: a, 2001-12-14: b, c: 2001-12-14T21:59:43.10Z, d: 190:20:30}", "{1.0: a, 3.14159265358979: b, 0x1F: c, 1e+20: d, -3: e}",
		"{a: !!int 010, b: !!int \"12\", c: !!float 1, d: !!bool yes, e: !!str on, f: !!binary aGk=, g: !foo x, h: ! yes}",
		"[-, 1:, --- x]", "a: 1\n\n  2\n", "{a: ~, b: null, c: , d: NULL, e: True, f: FALSE}", "x: 12345678901234567891\ny: 1e400\n",
		"{\"caf\u00e9\": 1, \"cafe\u0301\": 2, \"name \": 3, name: 4, Name: 5}", "a: \"yes\"\nb: 'no'\nc: |\n  on\nd: >\n  010\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return // readManifest refuses it before asWritten
		}
		if err := asWritten([]byte(doc)); err != nil {
			return
		}
		if nonSpecificTag.MatchString(doc) {
			return // v3 reads "x: !" as null, YAML 1.2 and YAML 1.1 as ""
		}
		j12, ok := yaml12JSON(t, doc)
		if !ok {
			return
		}
		if string(j) != string(j12) {
			t.Fatalf("%q accepted, but YAML 1.1 (kubectl) reads %s and YAML 1.2 %s", doc, j, j12)
		}
	})
}
