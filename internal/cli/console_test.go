package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/cli/exitcode"
)

// TestConsoleListensOnLoopbackOnly: runledger console refuses an address
// others reach (anyone who reaches it acts as the user), as bad input.
func TestConsoleListensOnLoopbackOnly(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:7480", "127.0.0.2:0", "[::1]:7480", "localhost:7480"} {
		require.NoError(t, loopbackAddress(ok), ok)
	}
	for _, bad := range []string{"0.0.0.0:7480", ":7480", "[::]:7480", "10.0.0.1:7480", "example.com:7480", "127.0.0.1"} {
		err := loopbackAddress(bad)
		require.Error(t, err, bad)
		var e *exitcode.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, 2, e.Code, bad)
	}
	root := NewRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"console", "--address", "0.0.0.0:7480", "--no-cluster", "--dsn", "postgres://u:secret@h/db"})
	err := root.Execute()
	require.ErrorContains(t, err, "loopback only")
}
