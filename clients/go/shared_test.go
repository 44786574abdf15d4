package ringlock_test

// Shared locks and semaphores against a real node: readers hold a key
// together, a writer waits for them, a reader behind a waiting writer
// waits for the writer, tokens grow in grant order, a semaphore never has
// more holders than its limit, refusals of the other kind, renewal and
// loss of shared grants and permits.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

// waiters is how many acquires wait for key on the node (its L line).
func waiters(t *testing.T, addr, key string) uint64 {
	t.Helper()
	locks, _, err := ringlock.ListLocks(context.Background(), addr, nil, key, 0, 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		if l.Key == key {
			return l.Waiters
		}
	}
	return 0
}

// stillWaiting says whether c's acquire is still unanswered: after Sync
// every answer the node had decided before is in, so an acquire the node
// had granted is no longer pending.
func stillWaiting(t *testing.T, c *ringlock.Client, pending int) bool {
	t.Helper()
	if err := c.Sync(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	return c.PendingRequests() == pending
}

type granted struct {
	lock *ringlock.Lock
	err  error
}

func lockAsync(ctx context.Context, c *ringlock.Client, key string, kind ringlock.Kind, wait time.Duration) chan granted {
	ch := make(chan granted, 1)
	go func() {
		l, err := c.LockKind(ctx, key, kind, 10*time.Second, wait)
		ch <- granted{l, err}
	}()
	return ch
}

func got(t *testing.T, what string, ch chan granted) *ringlock.Lock {
	t.Helper()
	select {
	case g := <-ch:
		if g.err != nil {
			t.Fatalf("%s: %v", what, g.err)
		}
		return g.lock
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not granted within 5s", what)
	}
	return nil
}

func release(t *testing.T, l *ringlock.Lock) {
	t.Helper()
	if ok, err := l.Release(ctxFor(t, 10*time.Second)); !ok || err != nil {
		t.Fatalf("release of %v: %v %v", l, ok, err)
	}
}

// Readers hold together; a writer waits for both; a reader that arrives
// behind the waiting writer waits for the writer, and is granted when the
// writer releases. Tokens grow in grant order.
func TestReadersShareAndAWriterWaits(t *testing.T) {
	n := startSingle(t)
	a := connect(t, []string{n.addr}, nil)
	w := connect(t, []string{n.addr}, nil)
	r := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 30*time.Second)
	r1, err := a.LockKind(ctx, "cfg", ringlock.Shared, 10*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := a.LockKind(ctx, "cfg", ringlock.Shared, 10*time.Second, time.Second)
	if err != nil {
		t.Fatalf("a second reader beside the first: %v", err)
	}
	if r1.Kind() != ringlock.Shared || r2.Token() <= r1.Token() {
		t.Fatalf("readers %v then %v", r1, r2)
	}
	if _, ok, err := a.TryLock(ctx, "cfg", time.Second); ok || err != nil {
		t.Fatalf("an exclusive try-lock beside two readers: %v %v", ok, err)
	}
	writer := lockAsync(ctx, w, "cfg", ringlock.Exclusive, 10*time.Second)
	waitFor(t, "the writer to queue", func() bool { return waiters(t, n.addr, "cfg") == 1 })
	// The key is held shared, but a writer waits: a new reader waits too.
	if _, ok, err := a.TryLockKind(ctx, "cfg", ringlock.Shared, time.Second); ok || err != nil {
		t.Fatalf("a shared try-lock behind a waiting writer: %v %v", ok, err)
	}
	reader := lockAsync(ctx, r, "cfg", ringlock.Shared, 10*time.Second)
	waitFor(t, "the reader to queue behind the writer", func() bool { return waiters(t, n.addr, "cfg") == 2 })
	release(t, r1)
	if !stillWaiting(t, w, 1) {
		t.Fatal("the writer was granted while a reader still held the key")
	}
	release(t, r2)
	wl := got(t, "the writer", writer)
	if wl.Token() <= r2.Token() {
		t.Fatalf("the writer's token %d is not above the readers' (%d)", wl.Token(), r2.Token())
	}
	if !stillWaiting(t, r, 1) {
		t.Fatal("the reader behind the writer was granted beside the writer")
	}
	release(t, wl)
	rl := got(t, "the reader behind the writer", reader)
	if rl.Token() <= wl.Token() {
		t.Fatalf("the reader's token %d is not above the writer's (%d)", rl.Token(), wl.Token())
	}
	release(t, rl)
}

// Five goroutines contend for a semaphore of 2: never more than 2 hold it
// at once, and 2 do at some point; every permit has a token of its own.
func TestSemaphoreOfTwoAmongFive(t *testing.T) {
	n := startSingle(t)
	ctx := ctxFor(t, 60*time.Second)
	var holding, most atomic.Int32
	var mu sync.Mutex
	tokens := map[uint64]bool{}
	var wg sync.WaitGroup
	for g := 0; g < 5; g++ {
		c := connect(t, []string{n.addr}, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 4; round++ {
				l, err := c.LockKind(ctx, "pool", ringlock.Permits(2), 10*time.Second, 20*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				// Counted from after the grant to before the release: never
				// more than the node lets hold.
				now := holding.Add(1)
				for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
				}
				mu.Lock()
				dup := tokens[l.Token()]
				tokens[l.Token()] = true
				mu.Unlock()
				if dup {
					t.Errorf("token %d granted twice", l.Token())
				}
				time.Sleep(20 * time.Millisecond) // the work under the permit
				holding.Add(-1)
				if ok, err := l.Release(ctx); !ok || err != nil {
					t.Errorf("release: %v %v", ok, err)
				}
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m != 2 {
		t.Fatalf("at most %d held the semaphore of 2 at once", m)
	}
	if len(tokens) != 20 {
		t.Fatalf("%d distinct tokens for 20 permits", len(tokens))
	}
}

// A key of one kind refuses acquires of another with a *WrongKindError,
// and nothing changes: the holders still hold, the client goes on.
func TestWrongKind(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	other := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 30*time.Second)
	p, err := c.LockKind(ctx, "sem", ringlock.Permits(3), 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	var wk *ringlock.WrongKindError
	_, err = c.LockKind(ctx, "sem", ringlock.Permits(4), 10*time.Second, time.Second)
	if !errors.Is(err, ringlock.ErrWrongKind) || !errors.As(err, &wk) || wk.Limit != 3 || wk.Asked != ringlock.Permits(4) {
		t.Fatalf("a permit of 4 of a semaphore of 3: %v", err)
	}
	_, _, err = c.TryLockKind(ctx, "sem", ringlock.Shared, time.Second)
	if !errors.As(err, &wk) || wk.Limit != 3 {
		t.Fatalf("a shared acquire of a semaphore: %v", err)
	}
	// An exclusive acquire of a semaphore: the node says so with an E.
	_, err = other.Lock(ctx, "sem", 10*time.Second, time.Second)
	if !errors.As(err, &wk) || wk.Limit != 3 || wk.Reason == "" || wk.Asked != ringlock.Exclusive {
		t.Fatalf("an exclusive acquire of a semaphore: %v", err)
	}
	l, err := c.Lock(ctx, "lk", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.LockKind(ctx, "lk", ringlock.Permits(2), 10*time.Second, time.Second)
	if !errors.As(err, &wk) || wk.Limit != 0 || kindCount(err) != 1 {
		t.Fatalf("a permit of a lock: %v", err)
	}
	// Nothing changed: both are still held, and release as such.
	if _, ok, _ := c.TryLockKind(ctx, "sem", ringlock.Permits(3), time.Second); !ok {
		t.Fatal("the semaphore of 3 lost a permit to a refusal")
	}
	release(t, p)
	release(t, l)
	// A key with no holder is nobody's kind: the next acquire decides.
	l2, err := other.Lock(ctx, "lk", time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	release(t, l2)
}

// kindCount is how many of the sentinel kinds err matches (one, always).
func kindCount(err error) int {
	count := 0
	for _, k := range []error{ringlock.ErrTimeout, ringlock.ErrConnection, ringlock.ErrNoActiveNode,
		ringlock.ErrProtocol, ringlock.ErrNotAllowed, ringlock.ErrInvalidArgument, ringlock.ErrClosed,
		ringlock.ErrLockLost, ringlock.ErrWrongKind} {
		if errors.Is(err, k) {
			count++
		}
	}
	return count
}

// A shared acquire that waits its wait out is ErrTimeout (LockKind) or
// false (AcquireKind).
func TestSharedWaitRunsOut(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 20*time.Second)
	w, err := c.Lock(ctx, "busy", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.LockKind(ctx, "busy", ringlock.Shared, time.Second, 200*time.Millisecond); !errors.Is(err, ringlock.ErrTimeout) {
		t.Fatalf("a shared acquire of a held key: %v", err)
	}
	if e := time.Since(start); e < 200*time.Millisecond {
		t.Fatalf("the wait of 200ms ended after %v", e)
	}
	if l, ok, err := c.AcquireKind(ctx, "busy", ringlock.Shared, time.Second, 100*time.Millisecond); l != nil || ok || err != nil {
		t.Fatalf("AcquireKind shared of a held key: %v %v %v", l, ok, err)
	}
	// A permit of a lock is refused, not timed out.
	if _, _, err := c.AcquireKind(ctx, "busy", ringlock.Permits(1), time.Second, 100*time.Millisecond); !errors.Is(err, ringlock.ErrWrongKind) {
		t.Fatalf("a permit of a held lock: %v", err)
	}
	release(t, w)
}

// Shared grants and permits renew like exclusive locks: held well past
// their lease, then released; one released by someone else with its
// token is lost (refused).
func TestSharedAndPermitsRenew(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 30*time.Second)
	r, err := c.LockRenewingKind(ctx, "doc", ringlock.Shared, 600*time.Millisecond, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.LockRenewingKind(ctx, "slots", ringlock.Permits(1), 600*time.Millisecond, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind() != ringlock.Shared || p.Kind().Limit() != 1 {
		t.Fatalf("kinds %v %v", r.Kind(), p.Kind())
	}
	// Held past two and a half leases.
	time.Sleep(1500 * time.Millisecond)
	if _, ok, _ := c.TryLock(ctx, "doc", time.Second); ok {
		t.Fatal("a renewing shared grant was gone after 2.5 leases")
	}
	if _, ok, _ := c.TryLockKind(ctx, "slots", ringlock.Permits(1), time.Second); ok {
		t.Fatal("a renewing permit was gone after 2.5 leases")
	}
	for _, h := range []*ringlock.RenewingLock{r, p} {
		if st := h.Stats(); st.Renewals < 2 || h.Err() != nil {
			t.Fatalf("%s: %+v %v", h.Key(), st, h.Err())
		}
	}
	if ok, err := r.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	// Released by someone else with its token: the next renewal is
	// refused, and the loss is signalled.
	if ok, err := c.Release(ctx, "slots", p.Token()); !ok || err != nil {
		t.Fatalf("release by token: %v %v", ok, err)
	}
	select {
	case <-p.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the loss of a permit was not signalled within 2s")
	}
	var lost *ringlock.LostError
	if !errors.As(p.Err(), &lost) || !lost.Refused {
		t.Fatalf("Err: %v", p.Err())
	}
}

// A renewing permit whose node goes away (and with it the permit) says
// lost within its lease.
func TestPermitLostWhenTheNodeIsGone(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, &ringlock.Options{RedialInterval: 100 * time.Millisecond})
	ctx := ctxFor(t, 20*time.Second)
	p, err := c.LockRenewingKind(ctx, "gone", ringlock.Permits(4), time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a renewal", func() bool { return p.Stats().Renewals >= 1 })
	sent := time.Now()
	n.kill()
	select {
	case <-p.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("no loss signalled 3s after the node died (lease 1s)")
	}
	if e := time.Since(sent); e > 1300*time.Millisecond {
		t.Fatalf("loss signalled %v after the last confirmed renewal was sent, lease 1s", e)
	}
	var lost *ringlock.LostError
	if !errors.As(p.Err(), &lost) || lost.Refused {
		t.Fatalf("Err: %v", p.Err())
	}
	if cause := context.Cause(p.Context()); !errors.Is(cause, ringlock.ErrLockLost) {
		t.Fatalf("Context's cause: %v", cause)
	}
}

// Limits outside 1..65536 are refused before anything is sent.
func TestBadLimits(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 10*time.Second)
	for _, limit := range []int{0, -1, ringlock.MaxPermits + 1} {
		_, err := c.LockKind(ctx, "k", ringlock.Permits(limit), time.Second, 0)
		if !errors.Is(err, ringlock.ErrInvalidArgument) {
			t.Errorf("Permits(%d): %v", limit, err)
		}
	}
	l, err := c.LockKind(ctx, "k", ringlock.Permits(ringlock.MaxPermits), time.Second, 0)
	if err != nil {
		t.Fatal(fmt.Errorf("Permits(MaxPermits): %w", err))
	}
	release(t, l)
}
