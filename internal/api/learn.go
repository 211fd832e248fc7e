package api

import (
	"context"
	"net/http"

	"github.com/abox-dev/abox/internal/policy"
)

// GET /v1/learn returns the learning record; DELETE /v1/learn forgets it.
// Learn mode itself is set through PUT /v1/mode ("learn").

func (s *Server) getLearned(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Policy.Learned())
}

func (s *Server) clearLearned(w http.ResponseWriter, r *http.Request) {
	s.Policy.ClearLearned()
	s.logger().Info("learning record cleared")
	writeJSON(w, http.StatusOK, s.Policy.Learned())
}

// Learned returns the instance's learning record.
func (c *Client) Learned(ctx context.Context) (policy.LearnSnapshot, error) {
	var s policy.LearnSnapshot
	return s, c.do(ctx, http.MethodGet, "/v1/learn", nil, &s)
}

// ClearLearned forgets the instance's learning record.
func (c *Client) ClearLearned(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/v1/learn", nil, nil)
}
