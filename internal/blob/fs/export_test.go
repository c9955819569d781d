package fs

// SetReserve changes the free space s leaves.
func SetReserve(s *Store, n int64) { s.reserve = n }
