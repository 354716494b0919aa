// Package ui holds the flows page the agent serves at /ui/ (issue 37):
// the flow table with filters and a service map, plain HTML, CSS and
// JavaScript with no outside dependency, reading GET /v1/flows from the
// same origin.
package ui

import "embed"

// Files are the page's files.
//
//go:embed index.html app.js style.css
var Files embed.FS
