package worker

import (
	"errors"
	"io"
	"net/url"
	"strings"
	"sync"
)

// Secrets returns the strings of a DSN that must never be printed: the DSN
// itself and its password, in URL form (raw and decoded) or keyword/value
// form (quoted or not). Empty for an empty DSN.
func Secrets(dsn string) []string {
	if dsn == "" {
		return nil
	}
	out := []string{dsn}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			out = append(out, u.User.String(), p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	for _, f := range strings.Fields(dsn) {
		if p, ok := strings.CutPrefix(f, "password="); ok {
			p = strings.Trim(p, "'")
			if p != "" {
				out = append(out, p)
			}
		}
	}
	// Quoted keyword/value passwords may contain spaces.
	if i := strings.Index(dsn, "password='"); i >= 0 {
		rest := dsn[i+len("password='"):]
		if j := strings.Index(rest, "'"); j > 0 {
			out = append(out, rest[:j])
		}
	}
	return out
}

// Redact replaces every secret in s with "[redacted]"; longer secrets first,
// so that a DSN is not half-replaced by its password.
func Redact(s string, secrets []string) string {
	for _, sec := range longestFirst(secrets) {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
	}
	return s
}

// RedactError returns err with its message redacted (it no longer wraps err,
// whose chain could still print a secret), or err itself when it holds none.
func RedactError(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := Redact(msg, secrets); red != msg {
		return errors.New(red)
	}
	return err
}

func longestFirst(secrets []string) []string {
	out := append([]string(nil), secrets...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && len(out[j]) > len(out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// RedactingWriter writes to W with every secret replaced. Each Write is
// redacted on its own: loggers and printers write whole lines at a time.
type RedactingWriter struct {
	mu      sync.Mutex
	w       io.Writer
	secrets []string
}

// NewRedactingWriter wraps w.
func NewRedactingWriter(w io.Writer, secrets []string) *RedactingWriter {
	return &RedactingWriter{w: w, secrets: longestFirst(secrets)}
}

func (r *RedactingWriter) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := io.WriteString(r.w, Redact(string(p), r.secrets)); err != nil {
		return 0, err
	}
	return len(p), nil
}
