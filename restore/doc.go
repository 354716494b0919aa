// Package restore owns endpoint state on disk, so that after an agent
// restart every endpoint, IP and identity comes back.
//
// Each endpoint lives in <state-dir>/<id>/: ep.json (a versioned record
// with everything needed to rebuild the endpoint) and ep_config.h (a
// generated C header for humans and the datapath). These directories are
// the on-disk contract; they are written behind a write-ahead journal.
//
// The journal (<state-dir>/journal/, journal.go, journal_format.go) makes
// a write or removal durable: its record (endpoint ID, sequence number,
// the encoded ep.json or a tombstone, CRC-32C) is appended to a segment
// file and made durable with fdatasync. Segments are preallocated: written
// full of zeros and flushed once when made, by a goroutine ahead of need,
// so an append rewrites blocks the file already has and never changes its
// size or extents; fdatasync then writes the data and flushes the disk,
// without waiting for an ext4 journal commit (fallocate's unwritten
// extents would need one to convert). Appends are group-committed
// (append.go): one appender goroutine takes every request queued
// meanwhile, writes their records with one pwrite and makes them durable
// with one fdatasync, then answers them (the done callbacks).
//
// A checkpointer goroutine (checkpoint.go) writes the durable records into
// the directories, off the answer path: every second, or sooner when the
// journal or its queue fill up. A checkpoint coalesces the records per
// endpoint (a write followed by a removal writes nothing), writes each
// endpoint's files into <id>_next and exchanges it with <id> atomically
// (renameat2 RENAME_EXCHANGE; where the filesystem cannot, the rename
// dance with <id>_stale as the backup), moves removed ones into
// <state-dir>/trash/ (reused for new writes or deleted by the janitor
// goroutine), flushes with one syncfs(2), and then records in the journal
// through which sequence number the directories hold everything: segments
// holding only such records are reused (their blocks stay allocated and
// written; a new generation number in the header and in every record
// keeps the old records from being read as new ones). Everything is
// bounded: at most maxSegments segments, maxCheckpointQueue records
// waiting for a checkpoint, maxQueued requests waiting for the appender;
// when the checkpoint falls behind, the appender waits (back-pressure)
// and the answers with it. A write is refused with ENOSPC when the
// filesystem lacks the blocks its checkpoint will need.
//
// At Open the journal's records beyond the last checkpoint are read; Scan
// reports, per endpoint, the newer of its directory and those records,
// and the first checkpoint writes them into the directories (a directory
// a crash left torn is then rewritten, not quarantined). A record cut
// short at the tail (a crash during its append: it was never answered)
// fails its CRC and is ignored; a damaged record followed by valid ones
// is reported, the segment copied into the quarantine, and the records
// after it replayed: never a crash loop. Scan also resolves what an
// interrupted directory write leaves and quarantines directories it
// cannot read. Close checkpoints everything, so a stopped agent's
// directories hold all of its state; Persisted reads what a restart would
// find without changing anything.
//
// The files are encoded by hand (byte-identical to encoding/json) and the
// checkpoint's files written with raw syscalls relative to the state
// directory's fd, without allocating per request.
//
// How it works (ARCHITECTURE.md has the map):
//
// `restore/` — endpoint state on disk (`<state-dir>/<id>/ep.json` +
// `ep_config.h`), written behind a write-ahead journal (`doc.go`).
// `journal.go`, `journal_format.go`: `<state-dir>/journal/`, segment files
// preallocated (zeros written and flushed once, by a goroutine ahead of
// need) holding CRC'd records, and the checkpoint file. `append.go`: the
// appender goroutine group-commits requests (one pwrite and one fdatasync
// per group) and answers them. `checkpoint.go`: the checkpointer writes
// the journaled records into the directories (one goroutine does every
// mkdir and rename, as they lock the state directory; a fixed set of 8
// workers writes the group's files in parallel; one syncfs), then advances
// the checkpoint and frees segments. `peek.go`: `Persisted`, the read-only
// view of what a restart finds. `encode.go`: both files appended by hand
// into pooled buffers, byte-identical to `encoding/json` (fuzzed).
// `fs.go`: raw syscalls relative to the state directory's fd, paths built
// on the stack (no allocation per call); `sizes.go`: the sizes of what
// each directory holds, so a rewritten file is cut only when it shrank.
// `commit.go`: a write fills `<id>_next` and swaps it in with
// renameat2(RENAME_EXCHANGE), leaving the previous state in `<id>_next` as
// the spare the next write overwrites (the `<id>_stale` rename dance where
// the filesystem cannot exchange); a removal renames `<id>` into `trash/`,
// whose directories are recycled as new `<id>_next` (`trash.go`; the
// `janitor.go` goroutine deletes the surplus). `scan.go`: `Scan` resolves
// interrupted writes, keeps spares, recycles the trash, quarantines
// unreadable state (`quarantine.go`: `Quarantine` moves refused state
// aside through the journal and a checkpoint); Open reads the journal's
// records beyond the checkpoint, Scan reports them over the directories.
// `pkg/agent/restore.go` runs restore at start: validate, note the
// revision the datapath still realises (`RevisionReporter`), re-create
// endpoint actors in `restoring` (they re-claim IPs and re-acquire their
// identity numbers; those whose datapath realises their recorded revision
// with the same identity become ready without regenerating,
// `actors/endpoint_restore.go`), then the API turns ready.
//
// Durable before acknowledged. An endpoint's state is on disk (flushed)
// before its PUT answers, a label PATCH answers once a state write
// carrying the new labels is flushed (`actors/endpoint_labels.go`: the
// regeneration after the identity change writes it), and the state
// directory is gone (renamed into the trash, flushed) before its DELETE
// answers. A regeneration writes state before it touches the datapath. At
// every instant `<id>` holds the last acknowledged state or a newer
// complete one; `<id>_next` and `trash/` are scratch that Scan never reads
// state from.
//
// State changes are atomic on disk: a write fills `<id>_next` and
// exchanges it with `<id>` in one rename, a removal renames `<id>` into
// `trash/` in one step, so a crash leaves the old or the new state, never
// half of one.
package restore
