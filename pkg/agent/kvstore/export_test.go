package kvstore

// RefHash exposes refHash to the tests.
var RefHash = refHash
