package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// A daemon without metrics answers GET /metrics with a 404 that says so;
// the client returns it as an *Error, not as metrics text.
func TestMetricsWithoutRegistry(t *testing.T) {
	c, _, _ := startServer(t)
	text, err := c.Metrics(context.Background())
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusNotFound || !strings.Contains(e.Error(), "serve no metrics") || e.Hint == "" {
		t.Fatalf("Metrics = %q, %v; want a 404 naming the problem, with a hint", text, err)
	}
}
