// Package race says whether the race detector is built in (go test
// -race): a test whose timing assumes an uninstrumented build (the local
// stack under load, recovering within a stated time) skips itself under
// it, and make test runs it again without.
package race
