//go:build !linux

package demo

import "syscall"

// childAttr: nothing outside Linux; the demo stops its processes on Ctrl-C.
func childAttr() *syscall.SysProcAttr { return nil }
