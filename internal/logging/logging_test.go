package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		flag     string
		terminal bool
		want     string
	}{
		{"", true, FormatText},
		{"", false, FormatJSON},
		{"json", true, FormatJSON},
		{"text", false, FormatText},
	} {
		if got := (Options{Format: c.flag}).format(c.terminal); got != c.want {
			t.Errorf("format(%q, terminal %v) = %q, want %q", c.flag, c.terminal, got, c.want)
		}
	}
}

func TestParseLevel(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		bad  bool
	}{
		{"", 0, false}, {"info", 0, false}, {"error", 8, false}, {"debug", -1, false},
		{"0", 0, false}, {"4", -4, false}, {"-1", 0, true}, {"verbose", 0, true},
	} {
		got, err := parseLevel(c.in)
		if (err != nil) != c.bad || (!c.bad && int(got) != c.want) {
			t.Errorf("parseLevel(%q) = %d, %v; want %d, bad %v", c.in, got, err, c.want, c.bad)
		}
	}
}

// The same keys in both formats, and V(1) only at debug.
func TestNew(t *testing.T) {
	var b bytes.Buffer
	log, err := Options{Format: FormatJSON}.New(&b, false)
	if err != nil {
		t.Fatal(err)
	}
	log.WithValues("run", "ns/r", "attempt", 0).Info("shard finished", "shard", 2)
	log.V(1).Info("not shown")
	log.Error(errors.New("boom"), "failed")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got:\n%s", b.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	if m["msg"] != "shard finished" || m["run"] != "ns/r" || m["shard"] != 2.0 || m["attempt"] != 0.0 {
		t.Errorf("line %s", lines[0])
	}

	b.Reset()
	log, err = Options{Format: FormatText, Level: "debug"}.New(&b, false)
	if err != nil {
		t.Fatal(err)
	}
	log.WithValues("run", "ns/r").V(1).Info("processing run", "uidFrom", "derived from namespace/name")
	if got := b.String(); !strings.Contains(got, `msg="processing run" run=ns/r uidFrom="derived from namespace/name"`) {
		t.Errorf("text line %q", got)
	}

	if _, err := (Options{Format: "yaml"}).New(&b, false); err == nil {
		t.Error("--log-format yaml accepted")
	}
}

func TestIsTerminal(t *testing.T) {
	if IsTerminal(&bytes.Buffer{}) {
		t.Error("a buffer is no terminal")
	}
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Error("a file is no terminal")
	}
}
