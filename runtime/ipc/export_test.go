package ipc

import "time"

// ServeHandleForTest serves handle as rank of world, as Exchange's handout
// does, so a test can fake a peer in another process: it returns the
// socket, the instance to publish, and the handout's Close.
func ServeHandleForTest(rank, world int, handle []byte) (sock, instance string, close func() error, err error) {
	h, err := newHandout(rank, world, handle, 10*time.Second)
	if err != nil {
		return "", "", nil, err
	}
	return h.addr(), h.instance, h.Close, nil
}
