// Package restore will own endpoint state on disk: one directory per
// endpoint under --state-dir with a versioned JSON file and a generated
// ep_config.h, written to <id>_next, fsynced and renamed with <id>_stale
// as the backup; and the start-up sequence that reads it back, re-reserves
// IPs, re-acquires identities and re-creates endpoint actors in
// `restoring` before the API turns ready. It lands with the restore and
// crash-safety issue; the agent already holds mutating API calls with 503
// until restore finishes (pkg/agent, pkg/api).
package restore
