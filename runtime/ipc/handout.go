package ipc

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/collgen/collgen/runtime/fdpass"
)

// A handout gives this rank's CUDA IPC handle to the ranks of other
// processes over an fdpass socket, whose ends are checked with SO_PEERCRED:
// only processes of this user receive it. The handle never enters the store,
// which ranks of other users may be able to read (a file store on a shared
// directory, a TCP store without a secret), and a CUDA IPC handle is a
// capability: whoever holds it may map the memory.
//
// Exchange publishes the socket's name and a random instance id; a peer asks
// for the handle with both (fetchHandle). The handout serves until Close,
// and reports each rank it served on served, so Exchange can wait until
// every rank of another process has its handle before it closes the socket.
type handout struct {
	srv      *fdpass.Server
	instance string
	rank     int
	world    int
	handle   []byte

	served chan int // ranks served, each once

	mu    sync.Mutex
	given map[int]bool
}

// handleRequest asks a rank's handout for its handle.
type handleRequest struct {
	Instance string `json:"instance"`
	Rank     int    `json:"rank"` // the asking rank
}

// handleReply answers a handleRequest: the handle, or why not.
type handleReply struct {
	Handle []byte `json:"handle,omitempty"`
	Err    string `json:"err,omitempty"`
}

// newHandout starts serving handle to this user's processes on a fresh
// abstract socket; timeout bounds each connection.
func newHandout(rank, world int, handle []byte, timeout time.Duration) (*handout, error) {
	ln, err := fdpass.Listen("collgen-ipc-")
	if err != nil {
		return nil, err
	}
	h := &handout{instance: rand.Text(), rank: rank, world: world,
		handle: handle, served: make(chan int, world), given: map[int]bool{}}
	if h.srv, err = ln.Serve(timeout, h.answer); err != nil {
		ln.Close()
		return nil, err
	}
	return h, nil
}

// addr is the socket's name, published for peers.
func (h *handout) addr() string { return h.srv.Addr() }

// answer reads one request from c and replies.
func (h *handout) answer(c *fdpass.Conn) {
	b, _, err := c.Recv(0)
	if err != nil {
		return
	}
	var req handleRequest
	var rep handleReply
	switch err := json.Unmarshal(b, &req); {
	case err != nil:
		rep.Err = "bad request: " + err.Error()
	case req.Instance != h.instance:
		rep.Err = fmt.Sprintf("request for exchange %q reached rank %d of exchange %q (a stale record, or another group's)", req.Instance, h.rank, h.instance)
	case req.Rank < 0 || req.Rank >= h.world || req.Rank == h.rank:
		rep.Err = fmt.Sprintf("request from rank %d: not a peer of rank %d in a world of %d", req.Rank, h.rank, h.world)
	default:
		rep.Handle = h.handle
	}
	msg, _ := json.Marshal(rep)
	if err := c.Send(msg); err != nil || rep.Err != "" {
		return
	}
	h.mu.Lock()
	first := !h.given[req.Rank]
	h.given[req.Rank] = true
	h.mu.Unlock()
	if first {
		h.served <- req.Rank // buffered for every rank: never blocks
	}
}

// waitServed returns once every rank in ranks has received the handle, or
// with an error naming those that did not when ctx ends.
func (h *handout) waitServed(ctx context.Context, ranks map[int]bool) error {
	missing := map[int]bool{}
	for r := range ranks {
		missing[r] = true
	}
	h.mu.Lock()
	for r := range h.given {
		delete(missing, r)
	}
	h.mu.Unlock()
	for len(missing) > 0 {
		select {
		case r := <-h.served:
			delete(missing, r)
		case <-ctx.Done():
			return fmt.Errorf("ipc: rank %d: ranks %v of other processes never collected its IPC handle: %w", h.rank, sortedRanks(missing), ctx.Err())
		}
	}
	return nil
}

// Close stops serving: the socket's name is released, open connections
// are closed, and Close returns once every answer has ended. Idempotent.
func (h *handout) Close() error { return h.srv.Close() }

// fetchHandle asks the handout at addr (instance, published by a rank of
// another process) for its handle, as rank asker. ctx bounds the exchange.
func fetchHandle(ctx context.Context, addr, instance string, asker int) ([]byte, error) {
	c, err := fdpass.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	req, _ := json.Marshal(handleRequest{Instance: instance, Rank: asker})
	if err := c.Send(req); err != nil {
		return nil, fmt.Errorf("ask for the handle: %w", err)
	}
	b, _, err := c.Recv(0)
	if err != nil {
		return nil, fmt.Errorf("read the handle: %w", err)
	}
	var rep handleReply
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("bad reply: %w", err)
	}
	if rep.Err != "" {
		return nil, errors.New(rep.Err)
	}
	return rep.Handle, nil
}

// sortedRanks lists a set of ranks in order.
func sortedRanks(set map[int]bool) []int { return slices.Sorted(maps.Keys(set)) }
