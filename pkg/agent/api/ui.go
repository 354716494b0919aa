package api

import (
	"net/http"

	"github.com/membrane-cni/membrane/pkg/agent/api/ui"
)

// uiRoutes serve the flows page (package ui) at /ui/: static files from
// the binary, reading GET /v1/flows from the same origin. Its scripts
// come only from the agent (a Content-Security-Policy without inline
// script), and no other site may frame it.
func (s *Server) uiRoutes(m *http.ServeMux) {
	files := http.StripPrefix("/ui/", http.FileServerFS(ui.Files))
	m.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
	m.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
	})
}
