package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// Placeholders replaced by dns_serve.go and http_serve.go.
func newDNSServeCmd(e *env) *cobra.Command {
	return &cobra.Command{Use: "serve", Short: "Run the DNS filter in the foreground", Hidden: true,
		RunE: func(*cobra.Command, []string) error { return errors.New("not built yet") }}
}

func newHTTPServeCmd(e *env) *cobra.Command {
	return &cobra.Command{Use: "serve", Short: "Run the HTTP filter in the foreground", Hidden: true,
		RunE: func(*cobra.Command, []string) error { return errors.New("not built yet") }}
}
