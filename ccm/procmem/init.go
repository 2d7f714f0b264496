package procmem

import "sync"

var initReleased struct {
	sync.Mutex
	bytes uint64
	err   error
}

// ReleaseDuringInit gives back the executable's pages that package
// initialization has touched so far (ReleaseExecPages) and adds the amount
// to InitReleased. Package initialization maps pages all over the executable
// and never runs again, so giving them back in the middle of it, from the
// init function of a package that the Go runtime initializes about half-way
// (see cmd/talos-ccm/internal/initpages), lowers the process's peak resident
// set as well as what it keeps. Call it again first thing in main. Only
// memory is at stake: an error is kept for InitReleased, not returned.
func ReleaseDuringInit() {
	n, err := ReleaseExecPages()
	initReleased.Lock()
	defer initReleased.Unlock()
	initReleased.bytes += n
	if initReleased.err == nil {
		initReleased.err = err
	}
}

// InitReleased returns what ReleaseDuringInit gave back in all, in bytes, and
// the first error it met.
func InitReleased() (uint64, error) {
	initReleased.Lock()
	defer initReleased.Unlock()
	return initReleased.bytes, initReleased.err
}
