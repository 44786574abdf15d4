package ringlock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Lock is a lock held: its key, its fencing token and a conservative
// deadline. It is not renewed (see KeepRenewed and Client.LockRenewing).
// Release it when done, or it stays held on the server until its lease
// runs out. Its methods are safe for use by several goroutines.
type Lock struct {
	client *Client
	key    string
	kind   Kind
	token  uint64

	mu       sync.Mutex
	lease    time.Duration
	deadline time.Time
}

// Key returns the lock's key.
func (l *Lock) Key() string { return l.key }

// Kind returns how the lock holds its key: Exclusive, Shared or
// Permits(N).
func (l *Lock) Kind() Kind { return l.kind }

// Token returns the fencing token: greater than every token the cluster
// issued before it, for any key and any kind. Pass it to the resource the
// lock protects, and have that resource refuse tokens older than the
// newest it has seen (docs/shared.md says what it checks with the tokens
// of shared grants).
func (l *Lock) Token() uint64 { return l.token }

// Lease returns the lease asked for (or given by the last renewal).
func (l *Lock) Lease() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lease
}

// Deadline returns when the lease runs out at the latest, as far as this
// process can tell: the moment the acquire (or the last successful
// renewal) was handed to a connection, plus the lease. The server starts
// the lease later (when it grants), so the real expiry is never earlier.
// For an acquire that waited in the queue it is pessimistic (possibly
// already past); a renewal gives a tight deadline again. Do not rely on it
// for safety across a pause of the process: rely on the fencing token.
func (l *Lock) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Release releases the lock: true if it was held and is released (the
// next waiter, if any, has it), false if it had already ended (its lease
// ran out, or it was released). Retried every 200 ms for 5 s on connection
// trouble; ErrConnection or ErrNoActiveNode after that.
func (l *Lock) Release(ctx context.Context) (bool, error) {
	return l.client.Release(ctx, l.key, l.token)
}

// Renew renews the lock for lease from when the server reads the request,
// and moves its deadline: false if it had already ended. Retried like
// Release.
func (l *Lock) Renew(ctx context.Context, lease time.Duration) (bool, error) {
	lms, err := leaseMs(lease)
	if err != nil {
		return false, err
	}
	until := time.Now().Add(l.client.opts.retryFor)
	held, sent, err := l.client.retrying(ctx, opRenew, l.key, renewLine(l.key, l.token, lms), until, nil)
	if err == nil && held {
		l.mu.Lock()
		l.lease = time.Duration(lms) * time.Millisecond
		l.deadline = sent.Add(l.lease)
		l.mu.Unlock()
	}
	return held, err
}

// String describes the lock (key and token).
func (l *Lock) String() string {
	if l.kind.op == 0 {
		return fmt.Sprintf("ringlock.Lock{%q, token %d}", l.key, l.token)
	}
	return fmt.Sprintf("ringlock.Lock{%q, %v, token %d}", l.key, l.kind, l.token)
}

// doing is what an acquire was doing, for the error it ends with when its
// deadline (wait plus grace) passes.
type doing int

const (
	doingConnecting doing = iota // waiting for a live connection
	doingQueueing                // waiting for room on a connection (local queueing)
	doingAsking                  // waiting for asking to answer
	doingRedirected              // following M answers, or waiting after M key -
)

type acquireState struct {
	doing   doing
	asking  string
	failure error // the last failed attempt
}

// Lock acquires key for lease, waiting at most wait in the server's FIFO
// queue (0: no limit), and returns the lock held, not renewed: release it
// with Lock.Release. ErrTimeout if the wait ran out (nothing is held).
//
// Arguments are checked before anything is sent (ErrInvalidArgument): a
// key of 1 to 250 bytes, each 0x21..0x7E or 0x80 and above; a lease of
// 1 ms to 86400 s (rounded down to whole milliseconds); a wait of at most
// 86400 s (rounded up).
//
// With a wait, the call ends by the wait plus the acquire grace (1 s)
// whatever the nodes do: ErrConnection names the node that did not answer.
// When ctx has a deadline sooner than the wait, the wait sent is what is
// left of ctx, so that the server gives up the request about when ctx
// does. A connection that drops or goes silent moves the request to the
// next connection, with what is left of its wait; ErrConnection after as
// many connections as the client has failed. M answers are followed
// (ErrNoActiveNode after the no-active timeout).
//
// Cancelling ctx returns ctx's error at once. The protocol has no request
// that withdraws a waiting acquire (it belongs to its connection until its
// wait ends): an acquire not yet written is never sent, one that is
// waiting on the server stays there, and if it is granted later the
// client releases it at once.
//
// A key that is a semaphore right now (see Permits) is refused: a
// *WrongKindError (ErrWrongKind). The protocol has no refusal answer for
// an exclusive acquire, so the node says so with an E line and closes that
// connection; the other requests that were on it are sent again on the
// next connection, as when a connection drops.
func (c *Client) Lock(ctx context.Context, key string, lease, wait time.Duration) (*Lock, error) {
	return c.LockKind(ctx, key, Exclusive, lease, wait)
}

// LockKind is Lock of a grant of kind: Exclusive (what Lock asks for),
// Shared (a read lock beside other shared holders) or Permits(n) (one of
// at most n permits, a counting semaphore). Each grant has its own fencing
// token and lease and is released, renewed and watched like an exclusive
// lock. Besides Lock's errors: a *WrongKindError (ErrWrongKind) when the
// key is of another kind (nothing changed); ErrInvalidArgument for a limit
// outside 1 to MaxPermits. A node that predates shared locks answers E
// (ErrProtocol), and so does a node started with --peers (they are not
// replicated yet).
func (c *Client) LockKind(ctx context.Context, key string, kind Kind, lease, wait time.Duration) (*Lock, error) {
	l, timedOut, err := c.acquireChecked(ctx, key, kind, lease, wait)
	if err != nil {
		return nil, err
	}
	if timedOut {
		return nil, newError(ErrTimeout, fmt.Sprintf("the wait for %q ran out", key))
	}
	return l, nil
}

// TryLock makes one attempt at key, with the shortest wait the protocol
// allows (TryWait, 1 ms: a wait of 0 means no limit), like flock -n. It
// returns (nil, false, nil) if someone else holds the lock.
func (c *Client) TryLock(ctx context.Context, key string, lease time.Duration) (*Lock, bool, error) {
	return c.TryLockKind(ctx, key, Exclusive, lease)
}

// TryLockKind is TryLock of a grant of kind (see LockKind): (nil, false,
// nil) when it cannot be granted at once (held exclusively, or shared
// behind a waiting exclusive acquire, or every permit taken).
func (c *Client) TryLockKind(ctx context.Context, key string, kind Kind, lease time.Duration) (*Lock, bool, error) {
	l, timedOut, err := c.acquireChecked(ctx, key, kind, lease, TryWait)
	if err != nil || timedOut {
		return nil, false, err
	}
	return l, true, nil
}

// Acquire is Lock with the outcome of the wait as a value: (lock, true,
// nil) when granted, (nil, false, nil) when the wait ran out (a node said
// so, or the request waited in the client's own queue for all of it).
func (c *Client) Acquire(ctx context.Context, key string, lease, wait time.Duration) (*Lock, bool, error) {
	return c.AcquireKind(ctx, key, Exclusive, lease, wait)
}

// AcquireKind is Acquire of a grant of kind (see LockKind).
func (c *Client) AcquireKind(ctx context.Context, key string, kind Kind, lease, wait time.Duration) (*Lock, bool, error) {
	l, timedOut, err := c.acquireChecked(ctx, key, kind, lease, wait)
	if err != nil || timedOut {
		return nil, false, err
	}
	return l, true, nil
}

func (c *Client) acquireChecked(ctx context.Context, key string, kind Kind, lease, wait time.Duration) (*Lock, bool, error) {
	if err := checkKey(key); err != nil {
		return nil, false, err
	}
	if err := kind.check(); err != nil {
		return nil, false, err
	}
	lms, err := leaseMs(lease)
	if err != nil {
		return nil, false, err
	}
	wms, err := waitMs(wait)
	if err != nil {
		return nil, false, err
	}
	if c.isClosed() {
		return nil, false, newError(ErrClosed, "")
	}
	if err := ctx.Err(); err != nil {
		return nil, false, ctxError("acquire", key, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		left := ceilMs(time.Until(dl))
		if left == 0 {
			return nil, false, ctxError("acquire", key, context.DeadlineExceeded)
		}
		if wms == 0 || left < wms {
			wms = left
		}
	}
	return c.acquire(ctx, key, kind, lms, wms)
}

func ctxError(what, key string, err error) error {
	return fmt.Errorf("ringlock: %s of %q: %w", what, key, err)
}

func (c *Client) acquire(ctx context.Context, key string, kind Kind, lms, wms uint64) (*Lock, bool, error) {
	started := time.Now()
	st := &acquireState{}
	if wms == 0 {
		l, timedOut, err := c.acquireLoop(ctx, key, kind, lms, 0, started, st)
		if err != nil && ctx.Err() != nil && kindOf(err) == nil {
			return nil, false, ctxError("acquire", key, ctx.Err())
		}
		return l, timedOut, err
	}
	wait := time.Duration(wms) * time.Millisecond
	grace := c.opts.acquireGrace
	dctx, cancel := context.WithDeadline(ctx, started.Add(wait+grace))
	defer cancel()
	l, timedOut, err := c.acquireLoop(dctx, key, kind, lms, wms, started, st)
	if err == nil || kindOf(err) != nil {
		return l, timedOut, err
	}
	if ctx.Err() != nil {
		return nil, false, ctxError("acquire", key, ctx.Err())
	}
	if dctx.Err() == nil {
		return nil, false, err
	}
	within := fmt.Sprintf("%v (its wait, %v, plus %v of grace)", wait+grace, wait, grace)
	switch st.doing {
	case doingAsking:
		return nil, false, newError(ErrConnection, fmt.Sprintf("%s did not answer the acquire of %q within %s", st.asking, key, within))
	case doingConnecting:
		return nil, false, newError(ErrConnection, fmt.Sprintf("no connection within %s: %s", within, c.whyNoConnection()))
	case doingRedirected:
		if st.failure != nil {
			return nil, false, st.failure
		}
		return nil, false, newError(ErrNoActiveNode, "no node became active within "+within)
	}
	return nil, false, nil // queueing in the client all along: the wait ran out
}

// acquireLoop tries connection after connection. It returns a plain
// context error when ctx ends; acquire says what that means.
func (c *Client) acquireLoop(ctx context.Context, key string, kind Kind, lms, wms uint64, started time.Time, st *acquireState) (*Lock, bool, error) {
	total := time.Duration(wms) * time.Millisecond
	ranOut := func() (*Lock, bool, error) {
		if st.failure != nil {
			return nil, false, st.failure
		}
		return nil, true, nil
	}
	failed := 0
	asked := false
	mv := newMoves(c.opts.noActive)
	for {
		// The deadline (or ctx) may have passed while following an M:
		// end now, with what the acquire was doing.
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		st.doing = doingConnecting
		cn, err := c.waitLive(ctx, "", false, c.opts.connectTimeout)
		if err != nil {
			return nil, false, err
		}
		if cn == nil {
			return nil, false, newError(ErrConnection, c.whyNoConnection())
		}
		// Local queueing: wait for room on this connection (within the
		// wait, if there is one).
		st.doing = doingQueueing
		qctx, qcancel := ctx, context.CancelFunc(func() {})
		if wms != 0 {
			qctx, qcancel = context.WithDeadline(ctx, started.Add(total))
		}
		ok, err := cn.takeSlot(qctx)
		qcancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, err
			}
			return ranOut()
		}
		if !ok {
			failed++
			why := cn.addr + ": the connection closed"
			if failed >= c.Connections() {
				return nil, false, cutOff(failed, why)
			}
			st.failure = newError(ErrConnection, why)
			continue
		}
		// The wait is the server's to count: the first attempt always goes
		// out (with at least the shortest wait), however long finding a
		// connection took, so that a free key is granted rather than
		// reported held. Later attempts carry what is left; one whose wait
		// ran out meanwhile ends with the last attempt's error.
		waitNow := uint64(0)
		if wms != 0 {
			elapsed := time.Since(started)
			switch {
			case elapsed < total:
				waitNow = ceilMs(total - elapsed)
			case asked:
				cn.giveSlot()
				return ranOut()
			default:
				waitNow = 1
			}
		}
		asked = true
		req := newRequest(kind.reqOp(), key, kindLine(kind, key, lms, waitNow))
		req.permit = true
		sent := time.Now()
		st.doing, st.asking = doingAsking, cn.addr
		rep, err := cn.call(ctx, req)
		if err != nil {
			return nil, false, err
		}
		switch rep.kind {
		case replyGranted:
			lease := time.Duration(lms) * time.Millisecond
			return &Lock{client: c, key: key, kind: kind, token: rep.token, lease: lease, deadline: sent.Add(lease)}, false, nil
		case replyTimedOut:
			return nil, true, nil
		case replyMoved:
			// No node said the wait ran out: if it runs out before
			// another node answers, the acquire ends with ErrNoActiveNode
			// (M key -, or a named node that came up but had not answered),
			// or an ErrConnection naming a named node that could not be
			// reached.
			st.doing = doingRedirected
			// A node that redirects decided nothing: the attempt at the
			// node it names goes out (with at least the shortest wait)
			// even if the wait ran out meanwhile, so a try-lock during a
			// failover asks the new active.
			asked = false
			if rep.addr == "" {
				st.failure = newError(ErrNoActiveNode, "the nodes answered that no node is active")
			} else {
				st.failure = c.unreached(rep.addr)
			}
			up, err := mv.moved(ctx, c, rep.addr)
			if err != nil {
				return nil, false, err
			}
			if up {
				st.failure = newError(ErrNoActiveNode, "redirected to "+rep.addr+", which had not answered when the wait ran out")
			} else if rep.addr != "" {
				st.failure = c.unreached(rep.addr)
			}
		case replyLost:
			failed++
			if failed >= c.Connections() {
				return nil, false, cutOff(failed, rep.why)
			}
			st.failure = newError(ErrConnection, rep.why)
		case replyWrongKind:
			return nil, false, &WrongKindError{Key: key, Asked: kind, Limit: rep.limit, Addr: cn.addr}
		case replyBroken:
			if rep.err == ErrWrongKind {
				return nil, false, &WrongKindError{Key: key, Asked: kind, Limit: rep.limit, Addr: cn.addr, Reason: rep.reason}
			}
			return nil, false, newError(rep.err, rep.why)
		default:
			return nil, false, newError(ErrProtocol, fmt.Sprintf("unexpected answer to %c from %s", kind.reqOp(), cn.addr))
		}
	}
}

func cutOff(failed int, last string) error {
	return newError(ErrConnection, fmt.Sprintf("no answer on %d connection(s) in a row; the last: %s", failed, last))
}

// Release releases the grant of key that carries token: true if it was
// held and is released (the next waiter, if any, has it), false if no
// grant of key carries token (released before, expired, never issued;
// after a retried attempt, false can also mean the first attempt had
// landed). Retried every 200 ms for 5 s on connection trouble, each
// attempt bounded by the request timeout (2 s), then ErrConnection (or
// ErrNoActiveNode).
func (c *Client) Release(ctx context.Context, key string, token uint64) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	if err := checkToken(token); err != nil {
		return false, err
	}
	until := time.Now().Add(c.opts.retryFor)
	held, _, err := c.retrying(ctx, opRelease, key, releaseLine(key, token), until, nil)
	return held, err
}

// Renew renews the grant of key with token: it now expires lease from
// when the server reads this. False: no such grant (it expired or was
// released). Retried like Release.
func (c *Client) Renew(ctx context.Context, key string, token uint64, lease time.Duration) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	if err := checkToken(token); err != nil {
		return false, err
	}
	lms, err := leaseMs(lease)
	if err != nil {
		return false, err
	}
	until := time.Now().Add(c.opts.retryFor)
	held, _, err := c.retrying(ctx, opRenew, key, renewLine(key, token, lms), until, nil)
	return held, err
}

// retrying sends a release or renew, retrying every RetryEvery until
// until when no connection carries it, and following M. Each attempt is
// bounded by the request timeout (and by until); trouble hears of each
// failed attempt. It returns the flag and when the attempt that got it was
// sent.
func (c *Client) retrying(ctx context.Context, o op, key string, line []byte, until time.Time, trouble func(string)) (bool, time.Time, error) {
	what := "release"
	if o == opRenew {
		what = "renew"
	}
	if c.isClosed() {
		return false, time.Time{}, newError(ErrClosed, "")
	}
	last := "no attempt could be made"
	followed, noActive := false, false
	started := time.Now()
	for {
		now := time.Now()
		if !now.Before(until) {
			break
		}
		if cn := c.pick("", false); cn != nil {
			bound := min(c.opts.requestTimeout, until.Sub(now))
			actx, cancel := context.WithTimeout(ctx, bound)
			rep, err := cn.call(actx, newRequest(o, key, line))
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return false, time.Time{}, ctxError(what, key, ctx.Err())
				}
				rep = reply{kind: replyLost, why: fmt.Sprintf("%s did not answer within %v", cn.addr, bound)}
			}
			noActive = false
			switch rep.kind {
			case replyFlag:
				return rep.flag, now, nil
			case replyMoved:
				if rep.addr != "" {
					last = "redirected to " + rep.addr
					c.follow(ctx, rep.addr, min(time.Until(until), c.opts.connectTimeout))
					if !followed {
						followed = true
						continue
					}
				} else {
					last, noActive = "no active node", true
				}
			case replyLost:
				last = rep.why
			case replyBroken:
				return false, time.Time{}, newError(rep.err, rep.why)
			default:
				return false, time.Time{}, newError(ErrProtocol, fmt.Sprintf("unexpected answer to %c from %s", o, cn.addr))
			}
		} else {
			if c.isClosed() {
				return false, time.Time{}, newError(ErrClosed, "")
			}
			last = c.whyNoConnection()
		}
		if trouble != nil {
			trouble(last)
		}
		if time.Now().Add(c.opts.retryEvery).After(until) {
			break
		}
		if err := sleep(ctx, c, c.opts.retryEvery); err != nil {
			if kindOf(err) != nil {
				return false, time.Time{}, err
			}
			return false, time.Time{}, ctxError(what, key, err)
		}
	}
	if noActive {
		return false, time.Time{}, newError(ErrNoActiveNode, what+": no active node in the cluster")
	}
	return false, time.Time{}, newError(ErrConnection, fmt.Sprintf("%s gave up after %.1fs: %s", what, time.Since(started).Seconds(), last))
}

// NodeStatus is what a node says of itself (S).
type NodeStatus struct {
	// Role is "active" or "standby".
	Role string
	// Active is the active node it knows ("" when it knows none).
	Active string
	// Token is the highest fencing token it has issued or seen (0: none).
	Token uint64
}

// AddrStatus is one address's status, or why it could not be had.
type AddrStatus struct {
	// Addr is the address asked.
	Addr string
	// Status is what the node said, when Err is nil.
	Status NodeStatus
	// Err is why the address gave no status.
	Err error
}

// Status asks every known address for its status (S), on its live
// connection (bounded by the request timeout) or, if it has none, on a
// one-off connection (bounded by the connect timeout). It never fails as a
// whole: each address has its own result.
func (c *Client) Status(ctx context.Context) []AddrStatus {
	addrs := c.Addresses()
	out := make([]AddrStatus, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := c.statusOf(ctx, a)
			out[i] = AddrStatus{Addr: a, Status: st, Err: err}
		}()
	}
	wg.Wait()
	return out
}

func (c *Client) statusOf(ctx context.Context, addr string) (NodeStatus, error) {
	if c.isClosed() {
		return NodeStatus{}, newError(ErrClosed, "")
	}
	if cn := c.pick(addr, true); cn != nil {
		limit := c.opts.requestTimeout
		sctx, cancel := context.WithTimeout(ctx, limit)
		rep, err := cn.call(sctx, newRequest(opStatus, "", []byte("S\n")))
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return NodeStatus{}, fmt.Errorf("ringlock: status of %s: %w", addr, ctx.Err())
		case err != nil:
			return NodeStatus{}, newError(ErrConnection, fmt.Sprintf("%s: no answer to S within %v", addr, limit))
		case rep.kind == replyStatus:
			return NodeStatus{Role: rep.role, Active: rep.addr, Token: rep.token}, nil
		case rep.kind == replyBroken:
			return NodeStatus{}, newError(rep.err, rep.why)
		}
	}
	return statusVia(ctx, addr, c.opts.tls, c.opts.connectTimeout)
}

// Sync is a barrier: it sends S on every live connection and waits for the
// answers (within the request timeout). When it returns nil, every request
// this client had handed to a connection before the call has been read by
// its node.
func (c *Client) Sync(ctx context.Context) error {
	if c.isClosed() {
		return newError(ErrClosed, "")
	}
	c.mu.Lock()
	var conns []*conn
	for _, s := range c.slots {
		if s.live != nil {
			conns = append(conns, s.live)
		}
	}
	c.mu.Unlock()
	if len(conns) == 0 {
		return newError(ErrConnection, c.whyNoConnection())
	}
	limit := c.opts.requestTimeout
	sctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	reqs := make([]*request, len(conns))
	for i, cn := range conns {
		reqs[i] = newRequest(opStatus, "", []byte("S\n"))
		if !cn.submit(reqs[i]) {
			return newError(ErrConnection, "a connection dropped during sync")
		}
	}
	for i, req := range reqs {
		select {
		case rep := <-req.ch:
			switch rep.kind {
			case replyStatus:
			case replyBroken:
				return newError(rep.err, rep.why)
			default:
				return newError(ErrConnection, "a connection dropped during sync: "+rep.why)
			}
		case <-sctx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("ringlock: sync: %w", ctx.Err())
			}
			return newError(ErrConnection, fmt.Sprintf("sync: %s did not answer S within %v", conns[i].addr, limit))
		}
	}
	return nil
}
