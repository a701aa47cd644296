package cli

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/version"
)

// `runledger version` and `runledger --version` print the same three facts.
func TestVersion(t *testing.T) {
	want := version.Get().String()
	require.Contains(t, want, "go: "+runtime.Version())
	for _, args := range [][]string{{"version"}, {"--version"}} {
		cmd := NewRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(args)
		require.NoError(t, cmd.Execute(), "%v", args)
		require.Equal(t, want, out.String(), "%v", args)
	}
	cmd := NewRootCommand()
	cmd.SetArgs([]string{"version", "extra"})
	require.Error(t, cmd.Execute())
}
