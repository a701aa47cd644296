package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// asWritten refuses what the conversion of a manifest document to JSON
// (sigs.k8s.io/yaml.YAMLToJSON: go.yaml.in/yaml/v2, the YAML 1.1 reader
// kubectl apply uses, and runledger run with it) would not keep as written:
//
//   - a plain scalar YAML 1.1 reads otherwise than YAML 1.2 does (yes and
//     on are true, n and off false, 010 is 8, 1_000 is 1000, 0b11 is 3);
//   - a key that does not become its own text (n: becomes "false", 010:
//     "8", 1.0: "1", True: "true");
//   - a key given twice in a mapping, compared byte for byte as JSON
//     compares them (true: and "true": are one key, of which YAML 1.1
//     keeps either);
//   - a key before a merge key (<<) that the merge also sets: YAML 1.1
//     takes the merged value, YAML 1.2 the key's own (a key after the <<
//     overrides a merged one in both, and is kept);
//   - a number JSON would not keep (keepsAsJSON).
//
// It names the line and the field of each, and what to write instead.
func asWritten(raw []byte) error {
	var root yamlv3.Node
	if err := yamlv3.Unmarshal(raw, &root); err != nil {
		return fmt.Errorf("reading it as YAML 1.2: %w", err)
	}
	c := &scalarCheck{raw: raw, kubectl: map[string]string{}, merged: map[*yamlv3.Node]map[string]bool{}}
	c.node(&root, nil)
	n, shown := len(c.problems), c.problems
	switch {
	case n == 0:
		return nil
	case n == 1:
		return errors.New(shown[0])
	case n > maxProblems:
		shown = append(shown[:maxProblems], fmt.Sprintf("and %d more", n-maxProblems))
	}
	return fmt.Errorf("%d problems:\n  %s", n, strings.Join(shown, "\n  "))
}

// maxProblems is how many problems one error lists: enough to show a
// pattern, few enough that the first stays on screen.
const maxProblems = 10

// scalarCheck is one document's walk.
type scalarCheck struct {
	raw      []byte
	lines    []string // raw's, once nonSpecific needs them
	problems []string
	// kubectl memoizes kubectlReads: a batch repeats its values.
	kubectl map[string]string
	// merged memoizes mergedKeys: an anchor may be merged many times.
	merged map[*yamlv3.Node]map[string]bool
}

// fieldPath is where a node is, for messages: spec.batch.items[0].payload.
type fieldPath struct {
	parent *fieldPath
	key    string
	index  int // when key is ""
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func (p *fieldPath) String() string {
	if p == nil {
		return ""
	}
	s := p.parent.String()
	switch {
	case p.key == "":
		return fmt.Sprintf("%s[%d]", s, p.index)
	case !plainKey.MatchString(p.key):
		return fmt.Sprintf("%s[%q]", s, p.key)
	case s == "":
		return p.key
	}
	return s + "." + p.key
}

func (c *scalarCheck) problem(n *yamlv3.Node, at *fieldPath, format string, args ...any) {
	where := fmt.Sprintf("line %d", n.Line)
	if at != nil {
		where += ", " + at.String()
	}
	c.problems = append(c.problems, where+": "+fmt.Sprintf(format, args...))
}

func (c *scalarCheck) node(n *yamlv3.Node, at *fieldPath) {
	switch n.Kind {
	case yamlv3.DocumentNode:
		for _, d := range n.Content {
			c.node(d, at)
		}
	case yamlv3.SequenceNode:
		for i, e := range n.Content {
			c.node(e, &fieldPath{parent: at, index: i})
		}
	case yamlv3.MappingNode:
		c.mapping(n, at)
	case yamlv3.ScalarNode:
		c.value(n, at)
	}
	// An alias is checked where its anchor is.
}

// isMergeKey is go.yaml.in/yaml/v2's test: a plain << or one tagged !!merge.
func isMergeKey(k *yamlv3.Node) bool {
	return k.Kind == yamlv3.ScalarNode && k.Value == "<<" && k.Tag == "!!merge"
}

func (c *scalarCheck) mapping(n *yamlv3.Node, at *fieldPath) {
	type key struct {
		name string
		line int
	}
	var before []key // the keys before the merge key
	var merge *yamlv3.Node
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if isMergeKey(k) {
			if merge != nil {
				c.problem(k, at, "the key %q is given twice (first at line %d)", k.Value, merge.Line)
			} else {
				merge = k
			}
			c.node(v, at) // what it merges, unless an alias, is written here
			continue
		}
		name := c.key(k, at)
		if first, ok := seen[name]; ok {
			c.problem(k, at, "the key %q is given twice (first at line %d)", name, first)
		}
		seen[name] = k.Line
		if merge == nil {
			before = append(before, key{name, k.Line})
		}
		c.node(v, &fieldPath{parent: at, key: name})
	}
	if merge == nil {
		return
	}
	merged := c.mergedKeys(n)
	for _, k := range before {
		if merged[k.name] {
			c.problem(merge, at, "the key %s (line %d) comes before the merge key << that also sets it: YAML 1.1 as kubectl reads it takes the merged value, YAML 1.2 this one; put << first", k.name, k.line)
		}
	}
}

// mergedKeys is the keys the merge keys of mapping n set, through merges
// of merges.
func (c *scalarCheck) mergedKeys(n *yamlv3.Node) map[string]bool {
	if keys, ok := c.merged[n]; ok {
		return keys
	}
	keys := map[string]bool{}
	c.merged[n] = keys
	for i := 0; i+1 < len(n.Content); i += 2 {
		if !isMergeKey(n.Content[i]) {
			continue
		}
		from := []*yamlv3.Node{n.Content[i+1]}
		if v := alias(from[0]); v.Kind == yamlv3.SequenceNode {
			from = v.Content
		}
		for _, m := range from {
			if m = alias(m); m.Kind != yamlv3.MappingNode {
				continue // the conversion refuses a merge of anything else
			}
			for j := 0; j+1 < len(m.Content); j += 2 {
				if !isMergeKey(m.Content[j]) {
					keys[alias(m.Content[j]).Value] = true
				}
			}
			for k := range c.mergedKeys(m) {
				keys[k] = true
			}
		}
	}
	return keys
}

func alias(n *yamlv3.Node) *yamlv3.Node {
	for n.Kind == yamlv3.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// key checks a mapping key and returns the JSON key it becomes, when it is
// kept: its text.
func (c *scalarCheck) key(k *yamlv3.Node, at *fieldPath) string {
	k = alias(k)
	if k.Kind != yamlv3.ScalarNode {
		c.problem(k, at, "a key that is a list or a mapping: a JSON key is a string")
		return ""
	}
	if !c.mayResolve(k, at) {
		return k.Value
	}
	got, err := c.kubectlReads(k, true)
	if err != nil {
		c.problem(k, at, "the key %s: %v", written(k), err)
		return k.Value
	}
	if got != k.Value && !c.nonSpecific(k) {
		c.problem(k, at, "the key %s becomes %s in YAML 1.1 (as kubectl reads it); write %s to keep it as written", written(k), quote(got), quote(k.Value))
	}
	return k.Value
}

// value checks a scalar that is not a key.
func (c *scalarCheck) value(n *yamlv3.Node, at *fieldPath) {
	if !keepsAsJSON(n) {
		c.problem(n, at, "the number %s would not be kept as written (JSON holds it as a 64-bit integer or float, rounded); quote it to pass it as a string", n.Value)
		return
	}
	if !c.mayResolve(n, at) {
		return
	}
	v11, err := c.kubectlReads(n, false)
	if err != nil {
		c.problem(n, at, "%s: %v", written(n), err)
		return
	}
	v12, ok := yaml12(n)
	if ok && v11 == v12 || c.nonSpecific(n) {
		return
	}
	if !ok {
		v12 = "invalid"
	}
	c.problem(n, at, "%s is %s in YAML 1.1 (as kubectl reads it) but %s in YAML 1.2; write %s", written(n), v11, v12, instead(n, v11, v12))
}

// instead says what to write for each reading: the text quoted, or the
// JSON value.
func instead(n *yamlv3.Node, readings ...string) string {
	var alts []string
	kind := ""
	for _, r := range readings {
		if r == "invalid" || strings.HasPrefix(r, `"`) || slices.Contains(alts, r) {
			continue
		}
		alts = append(alts, r)
		if kind == "" {
			switch r {
			case "true", "false":
				kind = "boolean"
			case "null":
				kind = "null"
			default:
				kind = "number"
			}
		}
	}
	s := quote(n.Value) + " for the string"
	if len(alts) > 0 {
		s += fmt.Sprintf(" or %s for the %s", strings.Join(alts, " or "), kind)
	}
	return s
}

func quote(s string) string {
	b, _ := json.Marshal(s) // a JSON string is a YAML double-quoted one
	return string(b)
}

// written is a scalar as it was written, near enough for a message.
func written(n *yamlv3.Node) string {
	s := n.Value
	if n.Style&(yamlv3.DoubleQuotedStyle|yamlv3.SingleQuotedStyle|yamlv3.LiteralStyle|yamlv3.FoldedStyle) != 0 {
		s = quote(s)
	}
	if n.Style&yamlv3.TaggedStyle != 0 {
		s = n.Tag + " " + s
	}
	return s
}

// coreTags are the scalar tags YAML 1.1 and 1.2 both define.
var coreTags = map[string]bool{"!!str": true, "!!int": true, "!!float": true, "!!bool": true, "!!null": true}

// mayResolve reports whether scalar n may be read as something other than
// its text by either YAML: it is plain, or has a tag other than !!str. It
// refuses a tag the two do not share (!!binary, a custom tag).
func (c *scalarCheck) mayResolve(n *yamlv3.Node, at *fieldPath) bool {
	if n.Style&yamlv3.TaggedStyle != 0 {
		if !coreTags[n.Tag] {
			c.problem(n, at, "the tag %s: runledger reads !!str, !!int, !!float, !!bool and !!null only (YAML 1.1 drops the others, or decodes them: !!binary); write the value without it", n.Tag)
			return false
		}
		return n.Tag != "!!str"
	}
	if n.Style != 0 || strings.Contains(n.Value, "\n") {
		return false // quoted, literal, folded or over several lines: a string in both
	}
	// go.yaml.in/yaml/v2 resolves a plain scalar only if it starts with one
	// of these (its resolveTable), and every non-string of YAML 1.2's core
	// schema does too: the others are text in both (and nothing is null).
	return n.Value != "" && strings.IndexByte("+-.0123456789yYnNtTfFoO~", n.Value[0]) >= 0
}

// nonSpecific reports whether plain scalar n has the tag "!", which makes
// it a string in both YAMLs: go.yaml.in/yaml/v3 does not keep it, so it is
// read from the text, where n starts (at its tag or anchor).
func (c *scalarCheck) nonSpecific(n *yamlv3.Node) bool {
	if c.lines == nil {
		c.lines = strings.Split(string(c.raw), "\n")
	}
	if n.Line < 1 || n.Line > len(c.lines) {
		return false
	}
	line := []rune(c.lines[n.Line-1]) // a node's column counts characters
	if n.Column < 1 || n.Column > len(line) {
		return false
	}
	for _, p := range strings.Fields(string(line[n.Column-1:])) {
		switch {
		case p == "!":
			return true
		case !strings.HasPrefix(p, "&"):
			return false // past the anchor, a tag of its own or the value
		}
	}
	return false
}

// kubectlReads is scalar n as the conversion to JSON reads it (the same
// function, on a document of n alone): its JSON value, or the JSON key it
// becomes. The document is a flow collection unless n holds a flow
// indicator (then n was in a block one): a plain scalar is scanned alike in
// both, but "-" and "1:" are plain scalars in a flow collection only.
func (c *scalarCheck) kubectlReads(n *yamlv3.Node, asKey bool) (string, error) {
	text := n.Value
	if n.Style&yamlv3.TaggedStyle != 0 {
		text = n.Tag + " " + quote(n.Value) // the tag, not the style, decides
	}
	doc, flow := "["+text+"]", !strings.ContainsAny(text, ",[]{}")
	switch {
	case asKey && flow:
		doc = "{" + text + ": 0}"
	case asKey:
		doc = "? " + text + "\n: 0\n"
	case !flow:
		doc = "v: " + text + "\n"
	}
	if r, ok := c.kubectl[doc]; ok {
		return r, nil
	}
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return "", err
	}
	var r string
	switch {
	case asKey:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(j, &m); err != nil || len(m) != 1 {
			return "", fmt.Errorf("reads as %s", j)
		}
		for k := range m {
			r = k
		}
	case flow:
		r = string(bytes.TrimSuffix(bytes.TrimPrefix(j, []byte("[")), []byte("]")))
	default:
		r = string(bytes.TrimSuffix(bytes.TrimPrefix(j, []byte(`{"v":`)), []byte("}")))
	}
	c.kubectl[doc] = r
	return r, nil
}

// YAML 1.2's core schema (yaml.org/spec/1.2.2, 10.3.2), less .inf and .nan,
// which JSON does not hold (the conversion refuses them).
var (
	coreInt   = regexp.MustCompile(`^[-+]?[0-9]+$`)
	coreOct   = regexp.MustCompile(`^0o[0-7]+$`)
	coreHex   = regexp.MustCompile(`^0x[0-9a-fA-F]+$`)
	coreFloat = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)
)

// coreWords are the core schema's nulls and booleans: tag and JSON value.
var coreWords = map[string][2]string{
	"": {"!!null", "null"}, "~": {"!!null", "null"}, "null": {"!!null", "null"}, "Null": {"!!null", "null"}, "NULL": {"!!null", "null"},
	"true": {"!!bool", "true"}, "True": {"!!bool", "true"}, "TRUE": {"!!bool", "true"},
	"false": {"!!bool", "false"}, "False": {"!!bool", "false"}, "FALSE": {"!!bool", "false"},
}

// yaml12 is scalar n as YAML 1.2's core schema reads it, as JSON; false
// when its tag does not fit its text (!!bool yes).
func yaml12(n *yamlv3.Node) (string, bool) {
	kind, v := "!!str", quote(n.Value)
	word, isWord := coreWords[n.Value]
	switch s := n.Value; {
	case isWord:
		kind, v = word[0], word[1]
	case coreInt.MatchString(s) || coreOct.MatchString(s) || coreHex.MatchString(s):
		i, base := new(big.Int), 10
		if len(s) > 1 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x') {
			s, base = s[2:], map[byte]int{'o': 8, 'x': 16}[s[1]]
		}
		i.SetString(s, base)
		kind, v = "!!int", i.String()
	case coreFloat.MatchString(s):
		kind, v = "!!float", jsonFloat(s)
	}
	tag := kind
	if n.Style&yamlv3.TaggedStyle != 0 {
		tag = n.Tag
	}
	switch {
	case tag == kind:
		return v, true
	case tag == "!!str":
		return quote(n.Value), true
	case tag == "!!float" && kind == "!!int":
		return jsonFloat(v), true
	}
	return "", false
}

// jsonFloat is decimal s as a float64 in JSON, as encoding/json (the
// conversion's) writes it.
func jsonFloat(s string) string {
	f, _ := strconv.ParseFloat(s, 64) // beyond a float64, keepsAsJSON refused it
	b, _ := json.Marshal(f)
	return string(b)
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
