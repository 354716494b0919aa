// Package restore owns endpoint state on disk, so that after an agent
// restart every endpoint, IP and identity comes back.
//
// Each endpoint lives in <state-dir>/<id>/: ep.json (a versioned record
// with everything needed to rebuild the endpoint) and ep_config.h (a
// generated C header for humans and the datapath). A write fills
// <id>_next, which is made durable and then exchanged with <id>
// atomically (renameat2 RENAME_EXCHANGE; where the filesystem cannot, the
// rename dance with <id>_stale as the backup): <id> always holds the last
// acknowledged state or a newer complete one, and the previous state left
// in <id>_next is scratch the next write overwrites. A removal renames
// <id> into <state-dir>/trash/, whose directories are reused for new
// writes or deleted by the janitor goroutine. Scan resolves what an
// interrupted write leaves at start and quarantines what it cannot read
// (never a crash loop).
//
// Writes are asynchronous and group-committed: one writer goroutine takes
// every request queued meanwhile and readies their <id>_next directories,
// a fixed set of workers writes the group's files, one syncfs(2) makes
// them (and the previous group's swaps) durable, the writer swaps them in
// (renames lock the state directory: workers would only wait on each
// other), and the next syncfs answers them. Under load each group costs
// one flush; actors submit without blocking and are called back when
// their state is durable. The files are encoded by hand (byte-identical
// to encoding/json) and written with raw syscalls relative to the state
// directory's fd, without allocating per request.
package restore
