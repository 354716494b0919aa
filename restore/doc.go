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
package restore
