package api

// SetBeforeExtendWrite makes streams call f before each extension of
// their write deadline, until the returned function undoes it.
func SetBeforeExtendWrite(f func()) (undo func()) {
	beforeExtendWrite = f
	return func() { beforeExtendWrite = nil }
}
