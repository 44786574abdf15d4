package ringlock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// replyKind says what a pending request learned.
type replyKind int

const (
	replyGranted   replyKind = iota // A key token
	replyTimedOut                   // T key
	replyMoved                      // M key addr ("" for -)
	replyFlag                       // R/N key 1|0
	replyStatus                     // S role addr token
	replyLost                       // the connection closed, failed or went silent first
	replyBroken                     // the server sent E or broke the protocol
	replyWrongKind                  // G/C key semaphore N, C key lock
)

// reply is what a pending request learns.
type reply struct {
	kind  replyKind
	token uint64
	flag  bool
	addr  string // moved: the active node ("" for -); status: the active node
	role  string
	why   string
	err   error // replyBroken: ErrProtocol, ErrNotAllowed or ErrWrongKind
	limit int   // replyWrongKind, replyBroken with ErrWrongKind: the semaphore's limit (0: a lock)
	// replyBroken with ErrWrongKind: the node's reason, and the key as it
	// quotes it (see semaphoreRefusal).
	reason, quoted string
}

// request is one request on its way to a connection, then pending there.
type request struct {
	op     op
	key    string
	line   []byte
	probe  bool // a liveness probe: not counted as outstanding
	permit bool // holds one of its connection's waiting-acquire slots

	mu   sync.Mutex
	ch   chan reply // capacity 1; nil: nobody waits for the answer
	gone bool       // the caller stopped waiting
}

func newRequest(o op, key string, line []byte) *request {
	return &request{op: o, key: key, line: line, ch: make(chan reply, 1)}
}

// deliver hands the answer to the caller; false if the caller is gone.
func (r *request) deliver(rep reply) bool {
	if r.ch == nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone {
		return false
	}
	select {
	case r.ch <- rep:
	default: // answered twice: cannot happen, a request leaves the pending queues once
	}
	return true
}

// abandon marks the caller gone; it returns an answer that arrived
// meanwhile, if any.
func (r *request) abandon() (reply, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gone = true
	select {
	case rep := <-r.ch:
		return rep, true
	default:
		return reply{}, false
	}
}

func (r *request) isGone() bool {
	if r.ch == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gone
}

// conn is one live connection: pending requests by key in send order, a
// writer, a reader, a liveness watch, and the local queue of acquires
// waiting for room (at most MaxWaitingAcquires wait on the server).
type conn struct {
	client *Client
	slot   *slot
	addr   string
	nc     net.Conn
	rd     *bufio.Reader
	closed atomic.Bool

	mu          sync.Mutex
	queue       []*request // handed to the connection, not yet taken by the writer
	byKey       map[string][]*request
	status      []*request
	outstanding int // requests written and not answered, probes not counted
	lastRx      time.Time
	probeAt     time.Time // zero: no probe outstanding
	acqFree     int
	acqWaiters  []chan bool
	ended       bool

	wake  chan struct{} // the writer has work
	done  chan struct{} // closed when the connection ends
	watch *time.Timer   // the liveness check, armed while requests are outstanding
	armed bool
	end   sync.Once
	why   string
}

func newConn(c *Client, s *slot, nc net.Conn, rd *bufio.Reader) *conn {
	cn := &conn{
		client:  c,
		slot:    s,
		addr:    s.addr,
		nc:      nc,
		rd:      rd,
		byKey:   make(map[string][]*request),
		lastRx:  time.Now(),
		acqFree: c.opts.maxWaiting,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	cn.watch = time.AfterFunc(time.Hour, cn.check)
	cn.watch.Stop()
	return cn
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// submit hands a request to the writer; false if the connection ended.
func (cn *conn) submit(req *request) bool {
	cn.mu.Lock()
	if cn.ended {
		cn.mu.Unlock()
		return false
	}
	cn.queue = append(cn.queue, req)
	cn.mu.Unlock()
	signal(cn.wake)
	return true
}

// takeSlot waits, in order, for room for one more waiting acquire on this
// connection. False if the connection ended meanwhile; ctx's error if it
// ended first.
func (cn *conn) takeSlot(ctx context.Context) (bool, error) {
	cn.mu.Lock()
	if cn.ended {
		cn.mu.Unlock()
		return false, nil
	}
	if cn.acqFree > 0 && len(cn.acqWaiters) == 0 {
		cn.acqFree--
		cn.mu.Unlock()
		return true, nil
	}
	ch := make(chan bool, 1)
	cn.acqWaiters = append(cn.acqWaiters, ch)
	cn.mu.Unlock()
	select {
	case ok := <-ch:
		return ok, nil
	case <-ctx.Done():
		cn.mu.Lock()
		defer cn.mu.Unlock()
		for i, w := range cn.acqWaiters {
			if w == ch {
				cn.acqWaiters = append(cn.acqWaiters[:i], cn.acqWaiters[i+1:]...)
				return false, ctx.Err()
			}
		}
		// Given a slot (or told of the end) just now: hand it on.
		if ok := <-ch; ok {
			cn.giveSlotLocked()
		}
		return false, ctx.Err()
	}
}

func (cn *conn) giveSlot() {
	cn.mu.Lock()
	cn.giveSlotLocked()
	cn.mu.Unlock()
}

func (cn *conn) giveSlotLocked() {
	if cn.ended {
		return
	}
	if len(cn.acqWaiters) > 0 {
		w := cn.acqWaiters[0]
		cn.acqWaiters = cn.acqWaiters[1:]
		w <- true
		return
	}
	cn.acqFree++
}

// call sends req and waits for its answer, or for ctx. A caller that stops
// waiting abandons the request: an acquire not yet written is not sent,
// and a grant that arrives later is released at once.
func (cn *conn) call(ctx context.Context, req *request) (reply, error) {
	if !cn.submit(req) {
		if req.permit {
			cn.giveSlot()
		}
		return reply{kind: replyLost, why: cn.addr + ": the connection had closed"}, nil
	}
	select {
	case rep := <-req.ch:
		return rep, nil
	case <-ctx.Done():
		if rep, ok := req.abandon(); ok {
			if rep.kind == replyGranted {
				cn.client.releaseInBackground(req.key, rep.token)
			}
		}
		return reply{}, ctx.Err()
	}
}

// registerLocked records a request the writer took, in send order, and
// arms the liveness watch when the connection becomes busy. True if a probe
// must go out right behind it (the connection was already quiet for the
// probe interval).
func (cn *conn) registerLocked(req *request) bool {
	probe := false
	if !req.probe {
		if cn.outstanding == 0 && !cn.armed {
			t := &cn.client.opts
			now := time.Now()
			cn.armed = true
			if due := cn.lastRx.Add(t.probeInterval); now.Before(due) {
				cn.watch.Reset(due.Sub(now))
			} else if cn.probeAt.IsZero() {
				cn.probeAt = now
				cn.watch.Reset(t.probeTimeout)
				probe = true
			}
		}
		cn.outstanding++
		cn.client.inFlight.Add(1)
	}
	if req.op == opStatus {
		cn.status = append(cn.status, req)
	} else {
		cn.byKey[req.key] = append(cn.byKey[req.key], req)
	}
	return probe
}

// takeLocked removes the oldest pending request of key with op o (any op
// if o is 0).
func (cn *conn) takeLocked(key string, o op) *request {
	q := cn.byKey[key]
	at := -1
	for i, r := range q {
		if o == 0 || r.op == o {
			at = i
			break
		}
	}
	if at < 0 {
		return nil
	}
	req := q[at]
	q = append(q[:at:at], q[at+1:]...)
	if len(q) == 0 {
		delete(cn.byKey, key)
	} else {
		cn.byKey[key] = q
	}
	return cn.answeredLocked(req)
}

func (cn *conn) takeStatusLocked() *request {
	if len(cn.status) == 0 {
		return nil
	}
	req := cn.status[0]
	cn.status = cn.status[1:]
	return cn.answeredLocked(req)
}

func (cn *conn) answeredLocked(req *request) *request {
	if !req.probe {
		cn.outstanding--
		cn.client.inFlight.Add(-1)
	}
	if req.permit {
		cn.giveSlotLocked()
	}
	return req
}

// serve runs the connection until it ends and returns why. The reader
// runs here; the writer and the liveness watch beside it.
func (cn *conn) serve() string {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); cn.writer() }()
	go func() {
		select {
		case <-cn.client.closeCh:
			cn.finish(reply{kind: replyLost, why: "the client was closed"})
		case <-cn.done:
		}
	}()
	cn.reader()
	wg.Wait()
	return cn.why
}

func (cn *conn) writer() {
	var buf []byte
	for {
		select {
		case <-cn.wake:
		case <-cn.done:
			return
		}
		cn.mu.Lock()
		if cn.ended {
			cn.mu.Unlock()
			return
		}
		for _, req := range cn.queue {
			if isAcquire(req.op) && req.isGone() {
				// Its caller is gone before it was written: not worth sending.
				if req.permit {
					cn.giveSlotLocked()
				}
				continue
			}
			buf = append(buf, req.line...)
			if cn.registerLocked(req) {
				p := &request{op: opStatus, line: []byte("S\n"), probe: true}
				buf = append(buf, p.line...)
				cn.registerLocked(p)
			}
		}
		cn.queue = cn.queue[:0]
		cn.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if _, err := cn.nc.Write(buf); err != nil {
			cn.finish(reply{kind: replyLost, why: fmt.Sprintf("write to %s: %s", cn.addr, explain(err))})
			return
		}
		buf = buf[:0]
	}
}

func (cn *conn) reader() {
	for {
		line, err := cn.rd.ReadSlice('\n')
		if err != nil {
			switch {
			case errors.Is(err, bufio.ErrBufferFull):
				cn.finish(reply{kind: replyBroken, err: ErrProtocol,
					why: fmt.Sprintf("answer line from %s longer than %d bytes", cn.addr, maxAnswerLine)})
			case len(line) > 0 && errors.Is(err, io.EOF):
				cn.finish(reply{kind: replyLost, why: cn.addr + " closed the connection mid-line"})
			case errors.Is(err, io.EOF):
				cn.finish(reply{kind: replyLost, why: cn.addr + " closed the connection"})
			default:
				cn.finish(reply{kind: replyLost, why: fmt.Sprintf("read from %s: %s", cn.addr, explain(err))})
			}
			return
		}
		if end, ok := cn.dispatch(line[:len(line)-1]); !ok {
			cn.finish(end)
			return
		}
	}
}

// dispatch hands one answer line to the request it answers. An E, a
// malformed line or an answer that matches nothing ends the connection.
func (cn *conn) dispatch(line []byte) (reply, bool) {
	a, err := parseAnswer(line)
	cn.mu.Lock()
	// Any line is a sign of life.
	cn.lastRx = time.Now()
	cn.probeAt = time.Time{}
	if err != nil {
		cn.mu.Unlock()
		return reply{kind: replyBroken, err: ErrProtocol, why: fmt.Sprintf("%s: %v", cn.addr, err)}, false
	}
	var req *request
	rep := reply{}
	switch a.op {
	case 'E':
		cn.mu.Unlock()
		end := reply{kind: replyBroken, err: refusalKind(a.text), why: fmt.Sprintf("%s says: E %s", cn.addr, a.text)}
		if q, limit, ok := semaphoreRefusal(a.text); ok && end.err == ErrProtocol {
			end.err, end.limit, end.reason, end.quoted = ErrWrongKind, limit, a.text, q
		}
		return end, false
	case 'A':
		req, rep = cn.takeLocked(a.key, opAcquire), reply{kind: replyGranted, token: a.token}
	case 'T':
		req, rep = cn.takeLocked(a.key, opAcquire), reply{kind: replyTimedOut}
	case 'M':
		req, rep = cn.takeLocked(a.key, 0), reply{kind: replyMoved, addr: a.addr}
	case 'R':
		req, rep = cn.takeLocked(a.key, opRelease), reply{kind: replyFlag, flag: a.flag}
	case 'N':
		req, rep = cn.takeLocked(a.key, opRenew), reply{kind: replyFlag, flag: a.flag}
	case 'S':
		req, rep = cn.takeStatusLocked(), reply{kind: replyStatus, role: a.role, addr: a.addr, token: a.token}
	case 'G', 'C':
		req = cn.takeLocked(a.key, op(a.op))
		switch {
		case a.wrong:
			rep = reply{kind: replyWrongKind, limit: a.limit}
		case a.token == 0:
			rep = reply{kind: replyTimedOut}
		default:
			rep = reply{kind: replyGranted, token: a.token}
		}
	}
	cn.mu.Unlock()
	if req == nil {
		// H, K and L are never sent on a pooled connection.
		return reply{kind: replyBroken, err: ErrProtocol,
			why: fmt.Sprintf("%s: answer %q matches no pending request", cn.addr, clip(line))}, false
	}
	if !req.deliver(rep) && rep.kind == replyGranted {
		// Whoever asked is gone: do not leave the lock held until its
		// lease runs out.
		cn.client.releaseInBackground(req.key, rep.token)
	}
	return reply{}, true
}

// isAcquire says whether o is an acquire of any kind.
func isAcquire(o op) bool { return o == opAcquire || o == opShared || o == opPermit }

// wrongKindCulprits picks the requests an E refusing an exclusive acquire
// of a semaphore is about: the pending exclusive acquires of the key the
// reason quotes (all pending exclusive acquires if none matches, should
// the wording change). The connection's other requests did nothing wrong:
// they learn that it closed, and are sent again elsewhere.
func wrongKindCulprits(pending []*request, quoted string) func(*request) bool {
	matched := false
	for _, r := range pending {
		if r.op == opAcquire && quoteKey(r.key) == quoted {
			matched = true
			break
		}
	}
	return func(r *request) bool {
		return r.op == opAcquire && (!matched || quoteKey(r.key) == quoted)
	}
}

func clip(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}

// check is the liveness watch, run by a timer while requests are
// outstanding: it probes a connection that has received nothing for the
// probe interval (at once if it was already that quiet when it became
// busy), and ends it if the probe gets no answer (nothing at all received)
// within the probe timeout. It disarms itself when nothing is outstanding.
func (cn *conn) check() {
	t := &cn.client.opts
	cn.mu.Lock()
	if cn.ended {
		cn.mu.Unlock()
		return
	}
	now := time.Now()
	var next time.Time
	switch {
	case !cn.probeAt.IsZero():
		deadAt := cn.probeAt.Add(t.probeTimeout)
		if !now.Before(deadAt) {
			cn.mu.Unlock()
			cn.finish(reply{kind: replyLost,
				why: fmt.Sprintf("%s stopped answering: no answer to a probe within %v", cn.addr, t.probeTimeout)})
			return
		}
		next = deadAt
	case cn.outstanding == 0:
		cn.armed = false
	default:
		// Silence counts from the last answer: a request sent on a
		// connection quiet for the interval is probed at once.
		probeDue := cn.lastRx.Add(t.probeInterval)
		if !now.Before(probeDue) {
			cn.probeAt = now
			cn.queue = append(cn.queue, &request{op: opStatus, line: []byte("S\n"), probe: true})
			signal(cn.wake)
			next = now.Add(t.probeTimeout)
		} else {
			next = probeDue
		}
	}
	if !next.IsZero() {
		cn.watch.Reset(time.Until(next))
	}
	cn.mu.Unlock()
}

// finish ends the connection once: out of the rotation first, so that
// retries go elsewhere, then every request waiting here learns why.
func (cn *conn) finish(end reply) {
	cn.end.Do(func() {
		cn.closed.Store(true)
		cn.client.dropConn(cn)
		cn.mu.Lock()
		cn.ended = true
		cn.why = end.why
		unwritten := cn.queue
		cn.queue = nil
		pending := cn.status
		cn.status = nil
		for _, q := range cn.byKey {
			pending = append(pending, q...)
		}
		cn.byKey = nil
		for _, r := range pending {
			if !r.probe {
				cn.client.inFlight.Add(-1)
			}
		}
		cn.outstanding = 0
		cn.watch.Stop()
		waiters := cn.acqWaiters
		cn.acqWaiters = nil
		cn.mu.Unlock()
		close(cn.done)
		_ = cn.nc.Close()
		// Requests never written are simply lost (they may be retried):
		// a protocol error was not about them.
		lost := reply{kind: replyLost, why: end.why}
		for _, r := range unwritten {
			r.deliver(lost)
		}
		culprit := func(*request) bool { return true }
		if end.err == ErrWrongKind {
			culprit = wrongKindCulprits(pending, end.quoted)
		}
		bystander := reply{kind: replyLost, why: end.why}
		if end.err == ErrWrongKind {
			bystander.why = fmt.Sprintf("%s closed the connection after refusing another request (E %s)", cn.addr, end.reason)
		}
		for _, r := range pending {
			if culprit(r) {
				r.deliver(end)
			} else {
				r.deliver(bystander)
			}
		}
		for _, w := range waiters {
			w <- false
		}
	})
}
