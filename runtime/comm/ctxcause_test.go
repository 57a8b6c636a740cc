package comm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/collgen/collgen/coll"
	"github.com/collgen/collgen/runtime/rendezvous"
)

// TestDoneContextWithCause: Options.Context documents that a call whose
// Context is already done returns at once, ErrAborted when cancelled and
// ErrTimeout past its deadline. A context cancelled with a cause
// (context.WithCancelCause) or past a deadline with one
// (context.WithTimeoutCause), as servers commonly make them, must keep
// that kind, not become ErrDevice; the cause stays in the chain.
func TestDoneContextWithCause(t *testing.T) {
	why := errors.New("shutting down")
	cancelled, cancel := context.WithCancelCause(context.Background())
	cancel(why)
	expired, cancel2 := context.WithTimeoutCause(context.Background(), time.Nanosecond, why)
	defer cancel2()
	<-expired.Done()
	host := hostComms(t, rendezvous.NewMemStore(), 2, "cause")
	defer closeAll(t, host)
	gpu, _ := fakeComms(t, 2, Config{})
	defer closeAll(t, gpu)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		kind error
	}{{"cancelled", cancelled, ErrAborted}, {"expired", expired, ErrTimeout}} {
		xs := []float32{1, 2}
		err := AllReduceSlice(host[0], xs, xs, coll.Sum, Options{Context: tc.ctx})
		if !errors.Is(err, tc.kind) || !errors.Is(err, why) {
			t.Errorf("host, %s with a cause: %v (ErrDevice %v); want %v wrapping the cause", tc.name, err, errors.Is(err, ErrDevice), tc.kind)
		}
		err = gpu[0].AllReduce(DeviceBuffer(0x1000), DeviceBuffer(0x1000), 2, coll.F32, coll.Sum, Options{Context: tc.ctx})
		if !errors.Is(err, tc.kind) || !errors.Is(err, why) {
			t.Errorf("GPU, %s with a cause: %v (ErrDevice %v); want %v wrapping the cause", tc.name, err, errors.Is(err, ErrDevice), tc.kind)
		}
	}
}
