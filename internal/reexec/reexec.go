// Package reexec starts a test binary again in a role (serve a function,
// hold a claim and wait to be killed, ...) so a test can watch a process
// of its own: kill it, signal it, read its CPU. The role travels in one
// environment variable, read here only, so tests and the code they test
// read no variable of their own for it (the configuration loader,
// internal/instance, is the one reader of the functions' environment).
//
// A test package that starts children checks Role first in its TestMain
// and, in a role, does that role's work and exits instead of running its
// tests.
package reexec

import (
	"os"
	"strings"
)

// env carries "<role>" or "<role>:<arg>".
const env = "RELAYBUS_REEXEC"

// Role returns the role this process was started in and its argument
// ("", "" in a test binary started by go test).
func Role() (role, arg string) {
	role, arg, _ = strings.Cut(os.Getenv(env), ":")
	return role, arg
}

// Env returns the environment entry that starts a test binary in role,
// with arg (which may hold anything but a NUL): add it to the child's
// exec.Cmd.Env.
func Env(role, arg string) string {
	if arg == "" {
		return env + "=" + role
	}
	return env + "=" + role + ":" + arg
}
