// Package restore owns endpoint state on disk, so that after an agent
// restart every endpoint, IP and identity comes back.
//
// Each endpoint lives in <state-dir>/<id>/: ep.json (a versioned record
// with everything needed to rebuild the endpoint) and ep_config.h (a
// generated C header for humans and the datapath). A write goes to
// <id>_next, is made durable, and is renamed into place with <id>_stale as
// the backup. A removal renames the state to <id>_deleted in one step
// before deleting its files, so a crash never leaves half a state. Scan
// cleans the leftovers of interrupted writes and removals at start and
// quarantines what it cannot read (never a crash loop).
//
// Writes are asynchronous and group-committed: a single writer goroutine
// takes every request queued while the previous group was being written,
// writes all their files, makes them durable with one syncfs(2), renames
// them into place, and syncs again, so concurrent requests share two
// flushes instead of paying two each. Actors submit without blocking and
// are called back when their state is durable.
package restore
