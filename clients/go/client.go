package ringlock

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of every official client (docs/client.md, "Timeouts"); see the
// fields of Options of the same names.
const (
	// DefaultConnectTimeout bounds one dial and Connect.
	DefaultConnectTimeout = 3 * time.Second
	// DefaultProbeInterval is the silence before a busy connection is probed.
	DefaultProbeInterval = 500 * time.Millisecond
	// DefaultProbeTimeout is how long a probe (or the hello) may go unanswered.
	DefaultProbeTimeout = 500 * time.Millisecond
	// DefaultAcquireGrace is how long past its wait an acquire may take.
	DefaultAcquireGrace = time.Second
	// DefaultRequestTimeout bounds one attempt of a release or renew.
	DefaultRequestTimeout = 2 * time.Second
	// DefaultRetryEvery is how often releases and renewals are retried.
	DefaultRetryEvery = 200 * time.Millisecond
	// DefaultRetryFor is how long releases and renewals are retried.
	DefaultRetryFor = 5 * time.Second
	// DefaultRedialInterval is how often a dropped connection is redialled.
	DefaultRedialInterval = 3 * time.Second
	// DefaultNoActiveTimeout is how long a request follows M answers.
	DefaultNoActiveTimeout = 10 * time.Second
)

// maxSetting is the longest any setting may be (longer ones are cut).
const maxSetting = 365 * 24 * time.Hour

// Options configures a Client. The zero value of a field keeps its default.
type Options struct {
	// ConnectTimeout bounds one dial (with its TLS handshake), how long
	// Connect waits for a first connection, how long a request waits for
	// a live connection when none is up, and a one-off status connection.
	// Default 3 s.
	ConnectTimeout time.Duration
	// ProbeInterval: silence (nothing received) on a connection with
	// requests outstanding before it is probed with S. Default 500 ms.
	ProbeInterval time.Duration
	// ProbeTimeout: how long a probe may go unanswered before the
	// connection counts as dead; also how long a new connection's node has
	// to answer its first S. Default 500 ms.
	ProbeTimeout time.Duration
	// AcquireGrace: an acquire with a wait ends by its wait plus this,
	// whatever the nodes do. Default 1 s.
	AcquireGrace time.Duration
	// RequestTimeout bounds one attempt of a release or renew, and Status
	// and Sync on a live connection. Default 2 s.
	RequestTimeout time.Duration
	// RetryEvery and RetryFor: releases and renews are retried this often,
	// this long, on connection trouble. Defaults 200 ms and 5 s.
	RetryEvery, RetryFor time.Duration
	// RedialInterval: how often a dropped or dead connection is dialled
	// again. Default 3 s.
	RedialInterval time.Duration
	// NoActiveTimeout: how long a request keeps following M answers or
	// waiting through M key - (no active node). Default 10 s.
	NoActiveTimeout time.Duration
	// MaxWaitingAcquires: acquires waiting on one connection; more wait
	// inside the client, in order. 1 to 4096 (the default, the protocol's
	// limit).
	MaxWaitingAcquires int
	// TLS, when set, makes every connection TLS (1.2 or later), M targets
	// included. See LoadTLS. Its ServerName, if empty, is the host of each
	// address dialed.
	TLS *tls.Config
}

// settings are Options resolved.
type settings struct {
	connectTimeout, probeInterval, probeTimeout, acquireGrace time.Duration
	requestTimeout, retryEvery, retryFor, redial, noActive    time.Duration
	maxWaiting                                                int
	tls                                                       *tls.Config
}

func setting(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return min(d, maxSetting)
}

func resolve(o *Options) (settings, error) {
	if o == nil {
		o = &Options{}
	}
	s := settings{
		connectTimeout: setting(o.ConnectTimeout, DefaultConnectTimeout),
		probeInterval:  setting(o.ProbeInterval, DefaultProbeInterval),
		probeTimeout:   setting(o.ProbeTimeout, DefaultProbeTimeout),
		acquireGrace:   setting(o.AcquireGrace, DefaultAcquireGrace),
		requestTimeout: setting(o.RequestTimeout, DefaultRequestTimeout),
		retryEvery:     setting(o.RetryEvery, DefaultRetryEvery),
		retryFor:       setting(o.RetryFor, DefaultRetryFor),
		redial:         setting(o.RedialInterval, DefaultRedialInterval),
		noActive:       setting(o.NoActiveTimeout, DefaultNoActiveTimeout),
		maxWaiting:     o.MaxWaitingAcquires,
	}
	switch {
	case s.maxWaiting == 0:
		s.maxWaiting = MaxWaitingAcquires
	case s.maxWaiting < 0 || s.maxWaiting > MaxWaitingAcquires:
		return s, newError(ErrInvalidArgument, fmt.Sprintf("MaxWaitingAcquires %d (1 to %d)", s.maxWaiting, MaxWaitingAcquires))
	}
	if o.TLS != nil {
		conf, err := checkTLS(o.TLS)
		if err != nil {
			return s, err
		}
		s.tls = conf
	}
	return s, nil
}

// slot is one entry of the client's connection list: an address and,
// while it is up, its connection (guarded by Client.mu).
type slot struct {
	addr          string
	live          *conn
	failures      int
	lastErr       string
	dialingSince  time.Time
	everConnected bool
	kick          chan struct{} // dial now rather than at the next redial
}

// Client is a handle on a ringlock node or cluster, safe for use by many
// goroutines at once: their requests are pipelined on the same
// connections. Make one with Connect and end it with Close.
//
// It keeps one persistent connection per address (two when given one
// address), picks them round-robin, redials dropped ones every 3 s, probes
// silent ones, moves acquires to the next connection when theirs fails,
// follows M answers to the active node, and retries releases and renewals
// every 200 ms for 5 s (docs/protocol.md, "12. The official clients").
type Client struct {
	opts     settings
	given    []string
	inFlight atomic.Int64
	rr       atomic.Uint64
	closeCh  chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex
	slots   []*slot
	active  string        // the node an M named: preferred while it is up
	changed chan struct{} // closed (and replaced) when a connection comes or goes
	closed  bool
}

// Connect starts the connections to the cluster whose peer list is addrs
// (host:port each, spelled as the nodes' --peers list spells them, so that
// M answers name known addresses) and returns once one connection is up.
// It fails with ErrConnection only if no connection could be made: every
// address failed its first dial (refused, unresolvable, no answer to the
// hello S), or none connected within the connect timeout (or ctx ended).
// The other addresses keep being dialled in the background. opts may be
// nil.
func Connect(ctx context.Context, addrs []string, opts *Options) (*Client, error) {
	s, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	var list []string
	for _, a := range addrs {
		for _, part := range strings.Split(a, ",") {
			part = strings.TrimSpace(part)
			if part == "" || contains(list, part) {
				continue
			}
			if _, _, err := net.SplitHostPort(part); err != nil {
				return nil, newError(ErrInvalidArgument, fmt.Sprintf("address %q is not host:port", part))
			}
			list = append(list, part)
		}
	}
	if len(list) == 0 {
		return nil, newError(ErrInvalidArgument, "no server address given")
	}
	slots := list
	if len(list) == 1 {
		// One node: two connections, so that one dropping for a moment
		// does not interrupt service.
		slots = []string{list[0], list[0]}
	}
	return start(ctx, s, list, slots)
}

// start makes the client with one connection slot per entry of slots and
// waits for the first connection (see Connect).
func start(ctx context.Context, s settings, given, slots []string) (*Client, error) {
	c := &Client{opts: s, given: given, closeCh: make(chan struct{}), changed: make(chan struct{})}
	for _, a := range slots {
		c.addSlot(a)
	}
	timer := time.NewTimer(s.connectTimeout)
	defer timer.Stop()
	for {
		c.mu.Lock()
		changed := c.changed
		up, allFailed := 0, true
		for _, sl := range c.slots {
			if sl.live != nil {
				up++
			}
			if sl.failures == 0 {
				allFailed = false
			}
		}
		c.mu.Unlock()
		if up > 0 {
			return c, nil
		}
		if allFailed {
			why := c.whyNoConnection()
			c.Close()
			return nil, newError(ErrConnection, why)
		}
		select {
		case <-changed:
		case <-timer.C:
			if c.Connected() > 0 {
				return c, nil
			}
			why := fmt.Sprintf("no connection within %v: %s", s.connectTimeout, c.whyNoConnection())
			c.Close()
			return nil, newError(ErrConnection, why)
		case <-ctx.Done():
			c.Close()
			return nil, fmt.Errorf("ringlock: connect: %w", ctx.Err())
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Close closes every connection and stops every background task: calls
// still waiting fail with ErrClosed (or the error of their connection), and
// renewing locks stop renewing (they report themselves lost, their Done
// channels close). Locks still held stay held on the server until their
// leases run out: release them before closing. Close returns within about
// 2 s and may be called more than once.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closeCh)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	return nil
}

func (c *Client) isClosed() bool {
	select {
	case <-c.closeCh:
		return true
	default:
		return false
	}
}

// Addresses returns the distinct addresses the client knows: the given
// ones first, then those M answers named.
func (c *Client) Addresses() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, s := range c.slots {
		if !contains(out, s.addr) {
			out = append(out, s.addr)
		}
	}
	return out
}

// Connected returns how many connections are up right now.
func (c *Client) Connected() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.slots {
		if s.live != nil {
			n++
		}
	}
	return n
}

// Connections returns how many connections the client keeps (up or being
// redialled).
func (c *Client) Connections() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.slots)
}

// PendingRequests returns how many requests have been written and not yet
// answered (waiting acquires count, liveness probes do not): a gauge for
// monitoring.
func (c *Client) PendingRequests() int {
	return int(c.inFlight.Load())
}

func (c *Client) bumpLocked() {
	if c.closed {
		return
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Client) bump() {
	c.mu.Lock()
	c.bumpLocked()
	c.mu.Unlock()
}

func (c *Client) addSlot(addr string) {
	s := &slot{addr: addr, kick: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.slots = append(c.slots, s)
	c.wg.Add(1)
	c.mu.Unlock()
	go c.runSlot(s)
}

// runSlot dials, checks the hello, serves, and redials every RedialInterval
// (counted from the previous dial, so a connection that lived long is
// redialled at once and a flapping one at most once per period), until the
// client is closed.
func (c *Client) runSlot(s *slot) {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for !c.isClosed() {
		dialedAt := time.Now()
		c.mu.Lock()
		s.dialingSince = dialedAt
		c.mu.Unlock()
		cn, err := c.dial(s)
		c.mu.Lock()
		s.dialingSince = time.Time{}
		if err != nil {
			s.lastErr = err.Error()
			s.failures++
			c.mu.Unlock()
		} else if c.closed {
			c.mu.Unlock()
			_ = cn.nc.Close()
			return
		} else {
			s.live = cn
			s.everConnected = true
			c.bumpLocked()
			c.mu.Unlock()
			why := cn.serve()
			c.mu.Lock()
			s.lastErr = why
			c.mu.Unlock()
		}
		c.bump()
		// A kick left from while the connection was up is stale.
		select {
		case <-s.kick:
		default:
		}
		timer.Reset(time.Until(dialedAt.Add(c.opts.redial)))
		select {
		case <-timer.C:
		case <-s.kick:
			// Kicked by an M naming this node: dial now, but never more
			// than once per 100 ms (M answers for a dead node keep coming).
			if !timer.Stop() {
				<-timer.C
			}
			timer.Reset(time.Until(dialedAt.Add(min(100*time.Millisecond, c.opts.redial))))
			select {
			case <-timer.C:
			case <-c.closeCh:
				return
			}
		case <-c.closeCh:
			return
		}
	}
}

// dropConn takes a connection that ended out of the rotation.
func (c *Client) dropConn(cn *conn) {
	c.mu.Lock()
	if cn.slot.live == cn {
		cn.slot.live = nil
	}
	c.bumpLocked()
	c.mu.Unlock()
}

// dialNet opens a TCP (or TLS) connection to addr within the connect
// timeout, the TLS handshake included.
func (c *Client) dialNet(ctx context.Context, addr string) (net.Conn, error) {
	return dialAddr(ctx, addr, c.opts.tls, c.opts.connectTimeout, c.closeCh)
}

func dialAddr(ctx context.Context, addr string, conf *tls.Config, timeout time.Duration, stop <-chan struct{}) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if stop != nil {
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	d := &net.Dialer{}
	var nc net.Conn
	var err error
	if conf != nil {
		conf = forAddr(conf, addr)
		nc, err = (&tls.Dialer{NetDialer: d, Config: conf}).DialContext(ctx, "tcp", addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			what := "TCP connection"
			if conf != nil {
				what = "TCP connection and TLS handshake"
			}
			why := fmt.Sprintf("connect to %s: %s not finished after %v", addr, what, timeout)
			if conf != nil {
				why += " (a stalled node, or a port that does not speak TLS?)"
			}
			return nil, errors.New(why)
		}
		return nil, fmt.Errorf("connect to %s: %s", addr, explain(err))
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return nc, nil
}

// dial connects a slot and checks that its node answers: it sends S and
// wants an S answer within the probe timeout. A node that accepts
// connections but is hung (stopped, overloaded beyond help, not a ringlock
// node) fails here and never gets a request.
func (c *Client) dial(s *slot) (*conn, error) {
	nc, err := c.dialNet(context.Background(), s.addr)
	if err != nil {
		return nil, err
	}
	addr := s.addr
	fail := func(err error) (*conn, error) {
		_ = nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(c.opts.probeTimeout))
	if _, err := nc.Write([]byte("S\n")); err != nil {
		return fail(fmt.Errorf("write to %s: %s", addr, explain(err)))
	}
	rd := bufio.NewReaderSize(nc, maxAnswerLine)
	line, err := rd.ReadSlice('\n')
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fail(fmt.Errorf("%s accepted the connection but did not answer S within %v (hung?)", addr, c.opts.probeTimeout))
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			return fail(fmt.Errorf("%s answered S with a line longer than %d bytes: not a ringlock node?", addr, maxAnswerLine))
		}
		return fail(fmt.Errorf("read from %s: %s", addr, explain(err)))
	}
	_ = nc.SetDeadline(time.Time{})
	a, perr := parseAnswer(line[:len(line)-1])
	switch {
	case perr == nil && a.op == 'S':
		return newConn(c, s, nc, rd), nil
	case perr == nil && a.op == 'E':
		return fail(fmt.Errorf("%s refused the connection: E %s", addr, a.text))
	}
	return fail(fmt.Errorf("%s answered S with %q: not a ringlock node?", addr, clip(line)))
}

// pick returns a live connection: round-robin over the preferred (active)
// node's connections if it has any up, else over all. With only, just
// addr's connections.
func (c *Client) pick(addr string, only bool) *conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.slots)
	if n == 0 {
		return nil
	}
	start := int((c.rr.Add(1) - 1) % uint64(n))
	want := addr
	if !only {
		want = c.active
	}
	if want != "" {
		for i := 0; i < n; i++ {
			s := c.slots[(start+i)%n]
			if s.addr == want && s.live != nil && !s.live.closed.Load() {
				return s.live
			}
		}
		if only {
			return nil
		}
	}
	for i := 0; i < n; i++ {
		s := c.slots[(start+i)%n]
		if s.live != nil && !s.live.closed.Load() {
			return s.live
		}
	}
	return nil
}

// waitLive waits up to within for a live connection (see pick). It gives
// nil when none came up in time, ErrClosed or ctx's error.
func (c *Client) waitLive(ctx context.Context, addr string, only bool, within time.Duration) (*conn, error) {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		c.mu.Lock()
		closed, changed := c.closed, c.changed
		c.mu.Unlock()
		if closed {
			return nil, newError(ErrClosed, "")
		}
		if cn := c.pick(addr, only); cn != nil {
			return cn, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return c.pick(addr, only), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// follow follows an M naming addr: makes it the preferred node (dialling
// it if unknown) and waits up to within for it to be up. If it does not
// come up, the preference is dropped again.
func (c *Client) follow(ctx context.Context, addr string, within time.Duration) bool {
	c.mu.Lock()
	known, up := false, false
	var distinct []string
	var mine []*slot
	for _, s := range c.slots {
		if s.addr == addr {
			known = true
			up = up || s.live != nil
			mine = append(mine, s)
		}
		if !contains(distinct, s.addr) {
			distinct = append(distinct, s.addr)
		}
	}
	added := len(distinct) - len(c.given)
	c.mu.Unlock()
	if !known {
		if _, _, err := net.SplitHostPort(addr); err != nil || added >= maxRedirectAddrs {
			// A cluster has at most 16 nodes: a server naming ever new
			// addresses is not followed further.
			return false
		}
		c.addSlot(addr)
	} else if !up {
		// A node we know and have no connection to: dial it now rather
		// than at its next redial (it may be back), but do not wait for
		// it: most likely this is a stale M from a standby that has not
		// yet seen that node die. The request goes on through the
		// rotation (with the usual back-off) and finds the node there if
		// it came up.
		for _, s := range mine {
			signal(s.kick)
		}
		return false
	}
	c.mu.Lock()
	c.active = addr
	c.mu.Unlock()
	if cn, _ := c.waitLive(ctx, addr, true, within); cn != nil {
		return true
	}
	c.mu.Lock()
	if c.active == addr {
		c.active = ""
	}
	c.mu.Unlock()
	return false
}

// unreached is the error of an acquire redirected to addr that could not
// reach it.
func (c *Client) unreached(addr string) error {
	c.mu.Lock()
	why := ""
	for _, s := range c.slots {
		if s.addr == addr && s.lastErr != "" {
			why = s.lastErr
			break
		}
	}
	c.mu.Unlock()
	if why == "" {
		why = addr + ": not connected yet"
	}
	return newError(ErrConnection, fmt.Sprintf("redirected to %s, which could not be reached (%s)", addr, why))
}

func (c *Client) whyNoConnection() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []string
	for _, s := range c.slots {
		why := s.lastErr
		if why == "" && !s.dialingSince.IsZero() {
			what := "TCP connection"
			if c.opts.tls != nil {
				what = "TCP connection and TLS handshake"
			}
			why = fmt.Sprintf("connect to %s: %s not finished after %.1fs", s.addr, what, time.Since(s.dialingSince).Seconds())
		}
		if why == "" {
			why = s.addr + ": not connected yet"
		}
		if !contains(errs, why) {
			errs = append(errs, why)
		}
	}
	return "no live connection (" + strings.Join(errs, "; ") + ")"
}

// releaseInBackground releases a grant whose acquirer is gone, with the
// usual retries.
func (c *Client) releaseInBackground(key string, token uint64) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-c.closeCh:
				cancel()
			case <-ctx.Done():
			}
		}()
		_, _ = c.Release(ctx, key, token)
	}()
}

// moves bounds the time one request spends following M answers.
type moves struct {
	first   time.Time
	named   []string
	bound   time.Duration
	backoff time.Duration
}

func newMoves(bound time.Duration) *moves {
	return &moves{bound: bound, backoff: 50 * time.Millisecond}
}

// moved handles one M: one naming a node no earlier M for this request
// named is followed at once (a failover happened); every M key -, and an
// M naming a node named before, waits a growing delay first (50 ms, doubling
// up to 1 s). ErrNoActiveNode once the bound has passed. True: the named
// node is up (see follow).
func (m *moves) moved(ctx context.Context, c *Client, to string) (bool, error) {
	if m.first.IsZero() {
		m.first = time.Now()
	}
	if time.Since(m.first) >= m.bound {
		return false, newError(ErrNoActiveNode, fmt.Sprintf("the cluster kept redirecting or answered that no node is active for %v", m.bound))
	}
	news := to != "" && !contains(m.named, to) && len(m.named) <= maxRedirectAddrs
	if news {
		m.named = append(m.named, to)
	} else {
		left := m.bound - time.Since(m.first)
		if err := sleep(ctx, c, min(m.backoff, left)); err != nil {
			return false, err
		}
		m.backoff = min(m.backoff*2, time.Second)
	}
	if to == "" {
		return false, nil
	}
	left := m.bound - time.Since(m.first)
	return c.follow(ctx, to, min(left, c.opts.connectTimeout)), nil
}

// sleep waits d, or until ctx ends or the client is closed.
func sleep(ctx context.Context, c *Client, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closeCh:
		return newError(ErrClosed, "")
	}
}
