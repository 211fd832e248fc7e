package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// Placeholder replaced by http_serve.go.
func newHTTPServeCmd(e *env) *cobra.Command {
	return &cobra.Command{Use: "serve", Short: "Run the HTTP filter in the foreground", Hidden: true,
		RunE: func(*cobra.Command, []string) error { return errors.New("not built yet") }}
}
