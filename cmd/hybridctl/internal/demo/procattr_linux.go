package demo

import "syscall"

// childAttr makes the kernel kill a process the demo starts when the demo
// itself dies without cleaning up (SIGKILL, a crash), so talos-ccm and
// ccm-coordinator are never left running on their own.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
