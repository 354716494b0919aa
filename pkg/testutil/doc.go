// Package testutil holds helpers for tests that need root: a gate that
// skips unprivileged runs (and fails them under CI, where root is
// promised), and network namespaces that clean up after themselves.
package testutil
