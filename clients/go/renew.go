package ringlock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// RenewingLock is a held lock that renews itself in the background for as
// long as it is held, and says when it is lost, like an etcd session.
//
// A goroutine renews the lease (N key token lease, the lease the lock was
// taken with) a third of a lease after the last confirmed renewal was
// sent; a lock that waited in the queue is renewed at once (and that first
// renewal has at least a request timeout, or a third of the lease if that
// is shorter, to be confirmed). A renewal that
// fails for connection reasons (or meets M key - in a failover) is retried
// every 200 ms, each attempt bounded, until the lease could have run out.
// The lock is lost, and renewing stops, when a node answers that the grant
// is gone (N key 0), when no renewal was confirmed before the deadline
// (counted from when the last confirmed renewal was sent, so the loss is
// reported no later than the server can have let the lease run out), or
// when the client is closed.
//
// Select on Done next to the work the lock protects, or hand Context to
// that work: both end when the lock is lost (Err then says why) and when it
// is released. As always, the fencing token, not this signal, keeps a
// protected resource safe: a process paused past its lease cannot notice
// in time.
type RenewingLock struct {
	lock   *Lock
	every  time.Duration
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	ended  chan struct{} // the renewal goroutine has returned
	once   sync.Once

	mu       sync.Mutex
	renewals uint64
	failed   uint64
	lastErr  string
	lost     *LostError
}

// LockRenewing is Client.Lock, then the lock renews itself in the
// background (see RenewingLock). ErrTimeout if the wait ran out.
func (c *Client) LockRenewing(ctx context.Context, key string, lease, wait time.Duration) (*RenewingLock, error) {
	l, err := c.Lock(ctx, key, lease, wait)
	if err != nil {
		return nil, err
	}
	return l.KeepRenewed(), nil
}

// LockRenewingKind is LockKind, then the lock renews itself in the
// background (see RenewingLock): a shared grant or a permit renews and
// signals its loss exactly as an exclusive lock does.
func (c *Client) LockRenewingKind(ctx context.Context, key string, kind Kind, lease, wait time.Duration) (*RenewingLock, error) {
	l, err := c.LockKind(ctx, key, kind, lease, wait)
	if err != nil {
		return nil, err
	}
	return l.KeepRenewed(), nil
}

// KeepRenewed starts renewing l in the background, a third of its lease
// after each confirmed renewal. Use the RenewingLock from then on: its
// Release stops the renewals and releases the lock.
func (l *Lock) KeepRenewed() *RenewingLock {
	every := max(l.Lease()/3, time.Millisecond)
	ctx, cancel := context.WithCancelCause(context.Background())
	r := &RenewingLock{
		lock:   l,
		every:  every,
		ctx:    ctx,
		cancel: cancel,
		stop:   make(chan struct{}),
		ended:  make(chan struct{}),
	}
	go r.loop()
	return r
}

// Key returns the lock's key.
func (r *RenewingLock) Key() string { return r.lock.key }

// Kind returns how the lock holds its key (see Lock.Kind).
func (r *RenewingLock) Kind() Kind { return r.lock.kind }

// Token returns the fencing token (see Lock.Token).
func (r *RenewingLock) Token() uint64 { return r.lock.token }

// Lease returns the lease each renewal asks for.
func (r *RenewingLock) Lease() time.Duration { return r.lock.Lease() }

// Deadline returns the deadline of the last confirmed renewal (see
// Lock.Deadline).
func (r *RenewingLock) Deadline() time.Time { return r.lock.Deadline() }

// Done returns a channel that is closed when the lock is lost, or when
// renewing ends otherwise (Release, Detach). Err says which.
func (r *RenewingLock) Done() <-chan struct{} { return r.ctx.Done() }

// Context returns a context that is cancelled when Done is closed, with
// the *LostError as its cause (context.Cause) if the lock was lost. Hand
// it to the work the lock protects.
func (r *RenewingLock) Context() context.Context { return r.ctx }

// Err returns nil while the lock is held and after it was released or
// detached without a loss; once it is lost, a *LostError
// (errors.Is(err, ErrLockLost)).
func (r *RenewingLock) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost == nil {
		return nil
	}
	return r.lost
}

// RenewalStats is a snapshot of a RenewingLock's renewals.
type RenewalStats struct {
	// Renewals confirmed so far.
	Renewals uint64
	// FailedAttempts: renewal attempts that failed (connection trouble, no
	// active node) so far; they are retried every 200 ms until the
	// deadline.
	FailedAttempts uint64
	// LastError: why the last attempt failed, until a renewal is
	// confirmed again.
	LastError string
	// Deadline of the last confirmed renewal.
	Deadline time.Time
}

// Stats returns the renewals so far.
func (r *RenewingLock) Stats() RenewalStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RenewalStats{Renewals: r.renewals, FailedAttempts: r.failed, LastError: r.lastErr, Deadline: r.lock.Deadline()}
}

// halt stops the renewal goroutine and waits for it.
func (r *RenewingLock) halt() {
	r.once.Do(func() { close(r.stop) })
	<-r.ended
}

// Release stops renewing and releases the lock (retried every 200 ms for
// 5 s): true if it was held and is released, false if it had already
// ended (lost, or released before).
func (r *RenewingLock) Release(ctx context.Context) (bool, error) {
	r.halt()
	r.cancel(nil)
	return r.lock.Release(ctx)
}

// Detach stops renewing without releasing: the lock stays held until it
// is released with its token or its lease runs out. It returns the lock,
// with the deadline of the last confirmed renewal.
func (r *RenewingLock) Detach() *Lock {
	r.halt()
	r.cancel(nil)
	return r.lock
}

func (r *RenewingLock) setLost(lost *LostError) {
	r.mu.Lock()
	r.lost = lost
	r.mu.Unlock()
	r.cancel(lost)
}

func (r *RenewingLock) trouble(why string) {
	r.mu.Lock()
	r.failed++
	r.lastErr = why
	r.mu.Unlock()
}

// loop renews a third of a lease after the last confirmed renewal, each
// round retried until the deadline; it ends when the lock is lost or
// renewing is stopped.
func (r *RenewingLock) loop() {
	defer close(r.ended)
	l, c := r.lock, r.lock.client
	lease := l.Lease()
	lms := uint64(lease / time.Millisecond)
	line := renewLine(l.key, l.token, lms)
	// Stopping (Release, Detach) or closing the client ends every wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.stop:
		case <-c.closeCh:
		case <-ctx.Done():
		}
		cancel()
	}()
	stopped := func() bool {
		select {
		case <-r.stop:
			return true
		default:
			return false
		}
	}
	closedLoss := func() { r.setLost(&LostError{Closed: true, LastError: "the client was closed"}) }
	deadline := l.Deadline()
	first := true
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(time.Until(deadline.Add(-(lease - r.every))))
		select {
		case <-timer.C:
		case <-ctx.Done():
			if !stopped() {
				closedLoss()
			}
			return
		}
		// A lock that waited in the queue may come with a deadline already
		// past (counted from the acquire's sending): its first renewal
		// gets a request timeout (at most a third of the lease) to be
		// confirmed. A lock granted at once keeps its deadline.
		lossAt := deadline
		if first {
			lossAt = later(deadline, time.Now().Add(min(c.opts.requestTimeout, r.every)))
		}
		first = false
		for {
			if !time.Now().Before(lossAt) {
				r.expired()
				return
			}
			actx, acancel := context.WithDeadline(ctx, lossAt)
			held, sent, err := c.retrying(actx, opRenew, l.key, line, lossAt, r.trouble)
			acancel()
			if stopped() {
				return
			}
			if err == nil && held {
				deadline = later(deadline, sent.Add(lease))
				l.mu.Lock()
				l.deadline = deadline
				l.mu.Unlock()
				r.mu.Lock()
				r.renewals++
				r.lastErr = ""
				r.mu.Unlock()
				break
			}
			if err == nil {
				r.setLost(&LostError{Refused: true})
				return
			}
			if errors.Is(err, ErrClosed) || c.isClosed() {
				closedLoss()
				return
			}
			if ctx.Err() == nil && time.Now().Before(lossAt) {
				// A protocol error, or the retries gave up: try again
				// (another connection may do) until the deadline.
				r.trouble(err.Error())
				_ = sleep(ctx, c, min(c.opts.retryEvery, time.Until(lossAt)))
			}
		}
	}
}

func (r *RenewingLock) expired() {
	r.mu.Lock()
	why := r.lastErr
	r.mu.Unlock()
	if why == "" {
		why = "the last attempt was not answered in time"
	}
	r.setLost(&LostError{LastError: why})
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
