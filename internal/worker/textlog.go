package worker

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// NewTextLogger returns a logger for people reading a terminal or a CI log:
//
//	runledger: shard finished shard=2 state=done total=250 completed=250
//
// one line per message, on w. Verbosity above v is dropped.
func NewTextLogger(w io.Writer, prefix string, v int) logr.Logger {
	return logr.New(&textSink{w: w, prefix: prefix, v: v, mu: &sync.Mutex{}})
}

type textSink struct {
	w      io.Writer
	prefix string
	name   string
	values []any
	v      int
	mu     *sync.Mutex
}

func (s *textSink) Init(logr.RuntimeInfo)  {}
func (s *textSink) Enabled(level int) bool { return level <= s.v }

func (s *textSink) Info(_ int, msg string, kv ...any) { s.write("", msg, nil, kv) }

func (s *textSink) Error(err error, msg string, kv ...any) { s.write("error: ", msg, err, kv) }

func (s *textSink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.values = append(append([]any(nil), s.values...), kv...)
	return &c
}

func (s *textSink) WithName(name string) logr.LogSink {
	c := *s
	if c.name != "" {
		name = c.name + "/" + name
	}
	c.name = name
	return &c
}

func (s *textSink) write(kind, msg string, err error, kv []any) {
	var b strings.Builder
	b.WriteString(s.prefix)
	if s.name != "" {
		b.WriteString(s.name + ": ")
	}
	b.WriteString(kind + msg)
	all := append(append([]any(nil), s.values...), kv...)
	if err != nil {
		all = append(all, "error", err.Error())
	}
	for i := 0; i < len(all); i += 2 {
		b.WriteString(" ")
		fmt.Fprint(&b, all[i])
		b.WriteString("=")
		if i+1 < len(all) {
			b.WriteString(formatValue(all[i+1]))
		}
	}
	b.WriteString("\n")
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = io.WriteString(s.w, b.String())
}

func formatValue(v any) string {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case error:
		s = v.Error()
	case time.Duration:
		s = v.String()
	case fmt.Stringer:
		s = v.String()
	default:
		s = fmt.Sprint(v)
	}
	if s == "" || strings.ContainsAny(s, " \t\n\"=") {
		return strconv.Quote(s)
	}
	return s
}
