package cli

import (
	"github.com/spf13/cobra"

	"github.com/runledger/runledger/internal/version"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print runledger's version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write([]byte(version.Get().String()))
			return err
		},
	}
}
