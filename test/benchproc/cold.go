package benchproc

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cold drops the executable at path from the page cache, so that the process
// started from it next reads its pages from disk as it faults them in (kernel
// readahead), as a component does that starts on a node whose page cache does
// not hold its image: the benchmarks start every process they measure cold.
//
// Why: a process's cgroup is charged for the pages of its executable it reads
// into the page cache, and those it touches again count in the working set
// the kubelet reports; a binary that another process (the linker, an earlier
// run) had just read or written stays charged to that one, and on kernels with
// large page-cache folios (ext4 since Linux 6.16) a fault maps a whole folio
// whose size depends on how the file got into the page cache.
//
// It returns how many bytes of the file are still cached afterwards (pages
// that another process maps stay, and a file on tmpfs stays whole: its pages
// are the file).
func Cold(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("evict %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("evict %s: %w", path, err)
	}
	// dirty pages are not dropped: write them first
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("evict %s: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return 0, fmt.Errorf("evict %s: %w", path, err)
	}
	return cached(f, fi.Size())
}

// cached is how many bytes of f's first size bytes are in the page cache.
func cached(f *os.File, size int64) (int64, error) {
	if size == 0 {
		return 0, nil
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("residency of %s: %w", f.Name(), err)
	}
	defer func() { _ = unix.Munmap(m) }()
	page := int64(os.Getpagesize())
	vec := make([]byte, (size+page-1)/page)
	// golang.org/x/sys/unix has no Mincore wrapper on Linux
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, fmt.Errorf("residency of %s: mincore: %w", f.Name(), errno)
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += page
		}
	}
	return n, nil
}

// Logf is where a benchmark's notes go (testing.B's Logf).
type Logf func(format string, args ...any)

// ColdStart is Cold before a measured start: an error when the file cannot be
// dropped, a note through logf when some of it stayed cached (the start is
// then not cold, and the figure says less).
func ColdStart(logf Logf, path string) error {
	left, err := Cold(path)
	if err != nil {
		return err
	}
	if left > 0 {
		logf("%s: %d KiB stayed in the page cache (mapped by another process, or a file system that keeps files in memory): its start is not cold", path, left>>10)
	}
	return nil
}
