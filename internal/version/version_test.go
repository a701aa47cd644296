package version

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResolve(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	vcs := func(modified string) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified},
		}}
	}
	tests := []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		want            Info
	}{
		{name: "stamped by the Makefile wins", version: "v1.2.0-3-gabcdef0-dirty", commit: "abc", bi: vcs("true"),
			want: Info{Version: "v1.2.0-3-gabcdef0-dirty", Commit: "abc", GoVersion: "go1.99.1"}},
		{name: "git checkout, clean", bi: vcs("false"),
			want: Info{Version: "0123456", Commit: rev, GoVersion: "go1.99.1"}},
		{name: "git checkout, modified", bi: vcs("true"),
			want: Info{Version: "0123456-dirty", Commit: rev, GoVersion: "go1.99.1"}},
		{name: "go install module@version", bi: &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "v0.4.0"}},
			want: Info{Version: "v0.4.0", Commit: Unknown, GoVersion: "go1.99.1"}},
		{name: "only the version stamped", version: "v0.5.0", bi: vcs("false"),
			want: Info{Version: "v0.5.0", Commit: rev, GoVersion: "go1.99.1"}},
		{name: "nothing recorded (go test, no VCS)", bi: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			want: Info{Version: Unknown, Commit: Unknown, GoVersion: runtime.Version()}},
		{name: "no build info at all", bi: nil,
			want: Info{Version: Unknown, Commit: Unknown, GoVersion: runtime.Version()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, resolve(tt.version, tt.commit, tt.bi))
		})
	}
}

func TestString(t *testing.T) {
	require.Equal(t, "runledger v1.0.0\ncommit: abc\ngo: go1.99.1\n",
		Info{Version: "v1.0.0", Commit: "abc", GoVersion: "go1.99.1"}.String())
}
