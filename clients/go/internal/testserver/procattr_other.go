//go:build !linux

package testserver

import "os/exec"

// dieWithUs does nothing where there is no parent-death signal.
func dieWithUs(*exec.Cmd) {}
