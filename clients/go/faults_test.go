package ringlock_test

import (
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

// A stopped node (SIGSTOP: its kernel still accepts connections) costs an
// acquire with a wait at most the wait plus the grace.
func TestStoppedNodeCostsBoundedTime(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 20*time.Second)
	n.signal(syscall.SIGSTOP)
	defer n.signal(syscall.SIGCONT)
	start := time.Now()
	_, err := c.Lock(ctx, "stopped", 5*time.Second, time.Second)
	took := time.Since(start)
	if !errors.Is(err, ringlock.ErrConnection) {
		t.Fatalf("Lock on a stopped node: %v", err)
	}
	if took > 2300*time.Millisecond {
		t.Fatalf("Lock with a 1s wait on a stopped node took %v (wait + grace is 2s)", took)
	}
	start = time.Now()
	_, err = c.Release(ctx, "stopped", 7)
	if !errors.Is(err, ringlock.ErrConnection) {
		t.Fatalf("Release on a stopped node: %v", err)
	}
	if took := time.Since(start); took > 5500*time.Millisecond {
		t.Fatalf("Release on a stopped node took %v (retries for 5s)", took)
	}
}

// SIGTERM of a cluster's active hands over to the next node, which answers
// the waiting acquires' M: they follow it and are granted there, and the
// grant held before the hand-off is released there with its old token.
func TestClusterHandOffMovesWaitingAcquires(t *testing.T) {
	cl := startCluster(t, 3)
	c := connect(t, cl.addrs, nil)
	ctx := ctxFor(t, 30*time.Second)
	held, err := c.Lock(ctx, "handoff", 3*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		l   *ringlock.Lock
		err error
	}
	waiting := make(chan got, 1)
	go func() {
		l, err := c.Lock(ctx, "handoff", 10*time.Second, 15*time.Second)
		waiting <- got{l, err}
	}()
	waitFor(t, "the second acquire to wait", func() bool { return c.PendingRequests() == 1 })
	cl.nodes[0].signal(syscall.SIGTERM)
	cl.waitSettled(1, []int{1, 2}, 10*time.Second)
	// The old grant survived the hand-off: released on the new active.
	if ok, err := held.Release(ctx); !ok || err != nil {
		t.Fatalf("release after the hand-off: %v %v", ok, err)
	}
	select {
	case g := <-waiting:
		if g.err != nil {
			t.Fatalf("the waiting acquire: %v", g.err)
		}
		if g.l.Token() <= held.Token() {
			t.Fatalf("token %d after %d", g.l.Token(), held.Token())
		}
		_, _ = g.l.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting acquire was not granted on the new active within 10s")
	}
}

// Close stops every goroutine the client started.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	n := startSingle(t)
	before := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		c := connect(t, []string{n.addr, "127.0.0.1:1"}, nil)
		ctx := ctxFor(t, 10*time.Second)
		r, err := c.LockRenewing(ctx, "close", time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		select {
		case <-r.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("a renewing lock did not end with its client")
		}
		var lost *ringlock.LostError
		if !errors.As(r.Err(), &lost) || !lost.Closed {
			t.Fatalf("Err after Close: %v", r.Err())
		}
	}
	until := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(until) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
