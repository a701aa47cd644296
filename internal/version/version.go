// Package version tells which build of runledger is running: the version
// and commit the Makefile stamps in with -ldflags -X, or what the Go
// toolchain recorded (runtime/debug.ReadBuildInfo) when built otherwise.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the Makefile: go build -ldflags "-X github.com/runledger/runledger/internal/version.version=... -X ...commit=...".
var (
	version string
	commit  string
)

// Unknown stands for a version or commit nobody recorded.
const Unknown = "unknown"

// Info identifies a build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
}

// Get returns this binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, bi)
}

// resolve prefers the values stamped by -ldflags; without them it takes the
// module version (go install module@version) and the VCS revision Go
// records for a build inside a git checkout.
func resolve(stampedVersion, stampedCommit string, bi *debug.BuildInfo) Info {
	info := Info{Version: stampedVersion, Commit: stampedCommit, GoVersion: runtime.Version()}
	if bi == nil {
		return fill(info)
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	var revision string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if info.Commit == "" {
		info.Commit = revision
	}
	if info.Version == "" {
		switch {
		case bi.Main.Version != "" && bi.Main.Version != "(devel)":
			info.Version = bi.Main.Version
		case revision != "":
			// What `git describe --always --dirty` prints without a tag.
			info.Version = revision[:min(len(revision), 7)]
			if modified {
				info.Version += "-dirty"
			}
		}
	}
	return fill(info)
}

func fill(info Info) Info {
	if info.Version == "" {
		info.Version = Unknown
	}
	if info.Commit == "" {
		info.Commit = Unknown
	}
	return info
}

// String is what `runledger version` and `runledger --version` print.
func (i Info) String() string {
	return fmt.Sprintf("runledger %s\ncommit: %s\ngo: %s\n", i.Version, i.Commit, i.GoVersion)
}
