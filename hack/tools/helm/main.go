// Command chart generates charts/runledger from the kustomize bases in
// config/ (config/default is the one source of the objects) and packages it
// reproducibly for make release.
//
//	chart generate -root . -o charts/runledger
//	chart package -chart charts/runledger -version v1.2.3 -image REPO@sha256:... -epoch SECONDS -o dist
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: chart generate|package [flags]")
	}
	switch args[0] {
	case "generate":
		return runGenerate(args[1:])
	case "package":
		return runPackage(args[1:])
	default:
		return fmt.Errorf("unknown command %q: want generate or package", args[0])
	}
}
