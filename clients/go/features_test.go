package ringlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

// A waiting acquire whose ctx is cancelled returns at once; the request
// stays queued on the server (the protocol cannot withdraw it), and when it
// is granted the client releases it at once, so the next waiter gets the
// lock right after.
func TestCancelledAcquireIsReleasedWhenGranted(t *testing.T) {
	n := startSingle(t)
	holder := connect(t, []string{n.addr}, nil)
	waiter := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 20*time.Second)
	held, err := holder.Lock(ctx, "cancel", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := waiter.Lock(wctx, "cancel", 30*time.Second, 0)
		errc <- err
	}()
	// Queued on the server behind the holder.
	waitFor(t, "the acquire to wait on the server", func() bool { return waiter.PendingRequests() == 1 })
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock: %v, want context.Canceled", err)
		}
	case <-time.After(time.Second):
		t.Fatal("a cancelled Lock did not return within 1s")
	}
	// A third party queues behind the cancelled acquire.
	third := make(chan *ringlock.Lock, 1)
	go func() {
		l, err := holder.Lock(ctx, "cancel", 30*time.Second, 10*time.Second)
		if err != nil {
			t.Error(err)
		}
		third <- l
	}()
	waitFor(t, "the third acquire to wait", func() bool { return holder.PendingRequests() == 1 })
	released := time.Now()
	if ok, err := held.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	select {
	case l := <-third:
		// The cancelled waiter was granted in between and released at once.
		if e := time.Since(released); e > 2*time.Second {
			t.Fatalf("the next waiter got the lock %v after the release", e)
		}
		if l == nil {
			t.Fatal("no lock")
		}
		_, _ = l.Release(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the grant of the cancelled acquire was not released: the next waiter never got the lock")
	}
}

// A ctx deadline sooner than the wait becomes the wait sent to the server.
func TestContextDeadlineBoundsTheWait(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 10*time.Second)
	held, err := c.Lock(ctx, "dl", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Lock(short, "dl", time.Second, 0)
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ringlock.ErrTimeout) {
		t.Fatalf("Lock with a 300ms ctx: %v", err)
	}
	if e := time.Since(start); e > time.Second {
		t.Fatalf("took %v", e)
	}
	// The server gave it up by itself: nothing of it is left queued.
	waitFor(t, "the server to drop the waiter", func() bool {
		locks, _, err := ringlock.ListLocks(ctx, n.addr, nil, "dl", 0, 10, time.Second)
		return err == nil && len(locks) == 1 && locks[0].Waiters == 0
	})
	_, _ = held.Release(ctx)
}

func TestRenewingLockKeepsAndLoses(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 20*time.Second)
	r, err := c.LockRenewing(ctx, "renewing", 600*time.Millisecond, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Held well past its lease.
	time.Sleep(1500 * time.Millisecond)
	if _, ok, _ := c.TryLock(ctx, "renewing", time.Second); ok {
		t.Fatal("a renewing lock was free after 2.5 leases")
	}
	if st := r.Stats(); st.Renewals < 2 {
		t.Fatalf("renewals: %+v", st)
	}
	select {
	case <-r.Done():
		t.Fatalf("Done closed while held: %v", r.Err())
	default:
	}
	// Someone releases it with its token: the next renewal is refused.
	if ok, err := c.Release(ctx, "renewing", r.Token()); !ok || err != nil {
		t.Fatalf("release by token: %v %v", ok, err)
	}
	select {
	case <-r.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the loss was not signalled within 2s")
	}
	var lost *ringlock.LostError
	if err := r.Err(); !errors.Is(err, ringlock.ErrLockLost) || !errors.As(err, &lost) || !lost.Refused {
		t.Fatalf("Err: %v", err)
	}
	if cause := context.Cause(r.Context()); !errors.Is(cause, ringlock.ErrLockLost) {
		t.Fatalf("Context's cause: %v", cause)
	}
	if ok, err := r.Release(ctx); ok || err != nil {
		t.Fatalf("release of a lost lock: %v %v", ok, err)
	}

	// Released without a loss: Done closes, Err stays nil.
	r2, err := c.LockRenewing(ctx, "renewing", time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := r2.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	<-r2.Done()
	if r2.Err() != nil {
		t.Fatalf("Err after release: %v", r2.Err())
	}
}

// A renewing lock whose node goes away says lost within its lease.
func TestRenewingLockExpiresWhenTheNodeIsGone(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, &ringlock.Options{RedialInterval: 100 * time.Millisecond})
	ctx := ctxFor(t, 20*time.Second)
	// Right after the grant (the first renewal keeps the grant's deadline)
	// and after a renewal: lost within the lease of the last one sent.
	for _, renewed := range []bool{false, true} {
		r, err := c.LockRenewing(ctx, "gone", time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		if renewed {
			waitFor(t, "a renewal", func() bool { return r.Stats().Renewals >= 1 })
		}
		// The last confirmed request was sent before now: the loss is
		// due within a lease from now.
		sent := time.Now()
		n.kill()
		select {
		case <-r.Done():
		case <-time.After(3 * time.Second):
			t.Fatal("no loss signalled 3s after the node died (lease 1s)")
		}
		if e := time.Since(sent); e > 1300*time.Millisecond {
			t.Fatalf("renewed %v: loss signalled %v after the last confirmed request was sent, lease 1s", renewed, e)
		}
		var lost *ringlock.LostError
		if !errors.As(r.Err(), &lost) || lost.Refused {
			t.Fatalf("Err: %v", r.Err())
		}
		if !renewed {
			n = startNode(t, n.args...)
			c = connect(t, []string{n.addr}, &ringlock.Options{RedialInterval: 100 * time.Millisecond})
		}
	}
}

func TestListLocksAndStatus(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 10*time.Second)
	var held []*ringlock.Lock
	for i := 0; i < 3; i++ {
		l, err := c.Lock(ctx, fmt.Sprintf("jobs/%d", i), 30*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	other, err := c.Lock(ctx, "other", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	locks, cursor, err := c.ListLocks(ctx, n.addr, "jobs/", 0, 1000)
	if err != nil || cursor != 0 || len(locks) != 3 {
		t.Fatalf("ListLocks: %v %d %v", locks, cursor, err)
	}
	tokens := map[string]uint64{}
	for _, l := range held {
		tokens[l.Key()] = l.Token()
	}
	for _, li := range locks {
		if tokens[li.Key] != li.Token || li.LeaseLeft <= 0 || li.LeaseLeft > 30*time.Second+time.Millisecond {
			t.Errorf("listed %+v, held %d", li, tokens[li.Key])
		}
	}
	st := c.Status(ctx)
	if len(st) != 1 || st[0].Err != nil || st[0].Status.Role != "active" || st[0].Status.Token < other.Token() {
		t.Fatalf("Status: %+v", st)
	}
	if p, err := ringlock.QueryProblem(ctx, n.addr, nil, time.Second); p != "" || err != nil {
		t.Fatalf("QueryProblem: %q %v", p, err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// Many goroutines on one client, one key: mutual exclusion and FIFO-ish
// progress through pipelined requests.
func TestManyGoroutinesOneClient(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 30*time.Second)
	var mu sync.Mutex
	inside, last := 0, uint64(0)
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				l, err := c.Lock(ctx, "shared", 5*time.Second, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				if inside != 1 || l.Token() <= last {
					t.Errorf("inside %d, token %d after %d", inside, l.Token(), last)
				}
				last = l.Token()
				inside--
				mu.Unlock()
				if ok, err := l.Release(ctx); !ok || err != nil {
					t.Errorf("release: %v %v", ok, err)
				}
			}
		}()
	}
	wg.Wait()
}

// waitFor polls cond every 10 ms for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	until := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(until) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
