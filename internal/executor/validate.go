package executor

// Validate checks a request the way the executor will, and fills in its
// defaults, so that a caller can refuse bad input before it has a sandbox.
func (r *RunRequest) Validate() error { return r.validate("/workspace") }
