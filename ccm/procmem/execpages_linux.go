// Package procmem keeps a long-running Hybrid CCM process's resident memory
// small: ReleaseExecPages gives back the executable's pages that start-up
// touched, and DefaultGCPercent sets the Go heap's growth when GOGC does not.
package procmem

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ReleaseExecPages drops the executable's read-only pages (code and read-only
// data) from the process's resident set. Call it first thing in main, and
// again when start-up is done if you like.
//
// Package initialization of a cloud-controller-manager (or of a controller
// linking controller-runtime and Helm's SDK) runs an init function in about a
// thousand packages spread over the whole binary, and the kernel
// maps each faulting page together with its neighbours (fault-around), so a
// process that has done nothing yet holds some 35 MiB of the executable
// resident, most of which it never touches again. These pages are clean and
// backed by the executable: MADV_DONTNEED only unmaps them, and whatever the
// process uses later comes back from the page cache on first touch. Writable
// mappings (.data, .bss, heap) are never touched, and neither is a read-only
// mapping that holds a page of its own (smaps: Anonymous above 0): in a
// dynamically linked build the loader writes the relocated GOT and
// .data.rel.ro before making them read-only, and dropping those pages would
// bring back the file's unrelocated bytes.
//
// It returns how much file-backed resident memory the process gave back.
func ReleaseExecPages() (uint64, error) {
	before := rssFile()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("release executable pages: %w", err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("release executable pages: %w", err)
	}
	defer f.Close()
	ranges, err := cleanExecMappings(f, exe)
	if err != nil {
		return 0, fmt.Errorf("release executable pages: /proc/self/smaps: %w", err)
	}
	for _, r := range ranges {
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(r[0]), uintptr(r[1]-r[0]), syscall.MADV_DONTNEED); errno != 0 {
			return 0, fmt.Errorf("release executable pages: madvise %#x-%#x: %w", r[0], r[1], errno)
		}
	}
	var released uint64
	if after := rssFile(); after < before {
		released = before - after
	}
	return released, nil
}

// cleanExecMappings reads smaps and returns the address ranges of exe's
// private read-only mappings (r-xp, r--p) that hold no page of their own.
func cleanExecMappings(smaps io.Reader, exe string) ([][2]uint64, error) {
	var (
		out     [][2]uint64
		cur     [2]uint64
		current bool // the mapping being read is a candidate
		written bool // it holds anonymous (copied-on-write) pages
	)
	flush := func() {
		if current && !written {
			out = append(out, cur)
		}
		current, written = false, false
	}
	sc := bufio.NewScanner(smaps)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 {
			continue
		}
		if strings.HasSuffix(fs[0], ":") {
			// an attribute of the mapping above: "Anonymous:   4 kB"
			if current && fs[0] == "Anonymous:" && (len(fs) < 2 || fs[1] != "0") {
				written = true
			}
			continue
		}
		// a mapping: address perms offset dev inode path
		flush()
		if len(fs) != 6 || fs[5] != exe || (fs[1] != "r-xp" && fs[1] != "r--p") {
			continue
		}
		lo, hi, ok := strings.Cut(fs[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			continue
		}
		cur, current = [2]uint64{start, end}, true
	}
	flush()
	return out, sc.Err()
}

// rssFile is the process's file-backed resident memory in bytes (0 if unknown).
func rssFile() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
