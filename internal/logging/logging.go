// Package logging sets up the logger of every long-running runledger command
// (manager, worker, run): log/slog's JSON or text handler behind logr, chosen
// by one --log-format flag, with the same keys everywhere (run, shard,
// attempt).
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"golang.org/x/term"
)

// The formats of --log-format.
const (
	FormatJSON = "json"
	FormatText = "text"
)

// Options are the logging flags.
type Options struct {
	// Format is FormatJSON or FormatText; empty: text on a terminal, JSON
	// otherwise.
	Format string
	// Level is the least level logged: error, info, debug, or a verbosity N
	// (logr's V(N)).
	Level string
}

// AddFlags adds --log-format and --log-level to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Format, "log-format", "", "log format on stderr: json or text (default: text on a terminal, json otherwise)")
	fs.StringVar(&o.Level, "log-level", "info", "least level logged: error, info, debug, or a verbosity N (V(N) messages)")
}

// New returns the logger that writes to w; terminal says whether the
// stream w ends in is a terminal (see IsTerminal).
func (o Options) New(w io.Writer, terminal bool) (logr.Logger, error) {
	level, err := parseLevel(o.Level)
	if err != nil {
		return logr.Logger{}, err
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format := o.format(terminal); format {
	case FormatJSON:
		return logr.FromSlogHandler(slog.NewJSONHandler(w, opts)), nil
	case FormatText:
		return logr.FromSlogHandler(slog.NewTextHandler(w, opts)), nil
	default:
		return logr.Logger{}, fmt.Errorf("--log-format %q: want json or text", format)
	}
}

func (o Options) format(terminal bool) string {
	switch {
	case o.Format != "":
		return o.Format
	case terminal:
		return FormatText
	}
	return FormatJSON
}

// parseLevel maps a --log-level to slog's: logr's V(N) is slog level -N.
func parseLevel(s string) (slog.Level, error) {
	switch s {
	case "", "info":
		return slog.LevelInfo, nil
	case "error":
		return slog.LevelError, nil
	case "debug":
		return slog.Level(-1), nil // V(1), as controller-runtime's debug messages
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--log-level %q: want error, info, debug or a verbosity N >= 0", s)
	}
	return slog.Level(-n), nil
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}
