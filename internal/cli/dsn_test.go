package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
)

// TestDatabaseURL: where the DSN comes from (--dsn, --dsn-file, then
// $RUNLEDGER_DATABASE_URL), the clear error of each bad DSN file, which
// never holds the file's content, and the notice for a password in --dsn.
func TestDatabaseURL(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	const secret = "host=db user=app password=S3cret-in-file dbname=ledger"
	tests := []struct {
		name    string
		args    []string
		env     string
		want    string // the DSN
		wantErr string
		notice  bool // the ps notice on stderr
	}{
		{name: "file with a trailing newline", args: []string{"--dsn-file", file("nl", secret+"\n")}, want: secret},
		{name: "file with CRLF", args: []string{"--dsn-file", file("crlf", secret+"\r\n")}, want: secret},
		{name: "file without a newline", args: []string{"--dsn-file", file("plain", secret)}, want: secret},
		{name: "file over the environment", args: []string{"--dsn-file", file("over", secret)}, env: "host=other", want: secret},
		{name: "empty file", args: []string{"--dsn-file", file("empty", "")}, wantErr: "--dsn-file " + filepath.Join(dir, "empty") + " is empty: want a connection string"},
		{name: "blank file", args: []string{"--dsn-file", file("blank", "\n \n")}, wantErr: "is empty"},
		{name: "missing file", args: []string{"--dsn-file", filepath.Join(dir, "nope")}, wantErr: "reading --dsn-file: open " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{name: "a directory", args: []string{"--dsn-file", dir}, wantErr: "reading --dsn-file: read " + dir + ": is a directory"},
		{name: "both flags", args: []string{"--dsn", "host=db", "--dsn-file", file("both", secret)}, wantErr: "both --dsn and --dsn-file are set: pass one"},
		{name: "--dsn with a password", args: []string{"--dsn", secret}, want: secret, notice: true},
		{name: "--dsn with a password in a URL", args: []string{"--dsn", "postgres://app:pw@db/ledger"}, want: "postgres://app:pw@db/ledger", notice: true},
		{name: "--dsn without a password", args: []string{"--dsn", "postgres://app@db/ledger"}, want: "postgres://app@db/ledger"},
		{name: "environment", env: secret, want: secret},
		{name: "nothing", wantErr: "no database: pass --dsn or set RUNLEDGER_DATABASE_URL (or pass --dsn-file FILE)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envDatabaseURL, tt.env)
			for _, cmd := range []string{"run", "migrate"} {
				c := newRunCommand()
				if cmd == "migrate" {
					c = newMigrateCommand()
				}
				var stderr bytes.Buffer
				c.SetErr(&stderr)
				require.NoError(t, c.ParseFlags(tt.args))
				dsn, err := databaseURL(c)
				if tt.wantErr != "" {
					require.ErrorContains(t, err, tt.wantErr, cmd)
					require.NotContains(t, err.Error(), "S3cret", "the file's content is never echoed")
					require.Equal(t, v1alpha1.ExitBadInput, exitcode.OrElse(err, v1alpha1.ExitFailed), "bad input: exit 2")
					continue
				}
				require.NoError(t, err, cmd)
				require.Equal(t, tt.want, dsn, cmd)
				if tt.notice {
					require.Contains(t, stderr.String(), "--dsn holds a password, which other users of this machine can read (ps); prefer --dsn-file, $RUNLEDGER_DATABASE_URL or a .pgpass file")
				} else {
					require.Empty(t, stderr.String())
				}
				require.NotContains(t, stderr.String(), "S3cret")
			}
		})
	}
}
