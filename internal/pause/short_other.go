//go:build !linux

package pause

import "time"

// short is time.Sleep where no thread sleep is wired up.
func short(d time.Duration) { time.Sleep(d) }
