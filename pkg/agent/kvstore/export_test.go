package kvstore

// RefHash exposes refHash to the tests.
var RefHash = refHash

// SetMaxPending sets the bound of the mirror's queue until the test ends.
func SetMaxPending(tb interface{ Cleanup(func()) }, n int) {
	old := maxPending
	maxPending = n
	tb.Cleanup(func() { maxPending = old })
}
