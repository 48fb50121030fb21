package dlqreplay

import (
	"net/http"
	"time"
)

// StopJobsAfter makes h's replay job workers stop dead after n sends,
// lease kept and progress unwritten, as a worker whose instance vanished.
// Call it before the job starts.
func StopJobsAfter(h http.Handler, n int) { h.(*server).jobs.stopAfter = n }

// ShiftJobClock moves h's replay jobs' clock (leases, progress) by d.
// Call it before h serves a job.
func ShiftJobClock(h http.Handler, d time.Duration) {
	h.(*server).jobs.now = func() time.Time { return time.Now().Add(d) }
}
