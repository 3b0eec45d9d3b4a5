package testserver

import (
	"os/exec"
	"syscall"
)

// dieWithUs has the kernel kill the server if the test process ends
// without its cleanups (a -timeout panic): no server outlives its test.
func dieWithUs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
