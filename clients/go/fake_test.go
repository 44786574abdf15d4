package ringlock

// Unit tests of the answer parser and of the client's matching, probing,
// failover and retries, against fake servers written here: each fake
// answers what the test tells it to, or misbehaves on purpose.

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseAnswer(t *testing.T) {
	good := map[string]answer{
		"A k 7":                       {op: 'A', key: "k", token: 7},
		"A k 18446744073709551615":    {op: 'A', key: "k", token: 18446744073709551615},
		"A k 0007":                    {op: 'A', key: "k", token: 7},
		"T k":                         {op: 'T', key: "k"},
		"M k 10.0.0.1:7171":           {op: 'M', key: "k", addr: "10.0.0.1:7171"},
		"M k -":                       {op: 'M', key: "k"},
		"R k 1":                       {op: 'R', key: "k", flag: true},
		"N k 0":                       {op: 'N', key: "k"},
		"S active 1.2.3.4:5 9":        {op: 'S', role: "active", addr: "1.2.3.4:5", token: 9},
		"S standby - 0":               {op: 'S', role: "standby"},
		"H ok":                        {op: 'H'},
		"H two words":                 {op: 'H', text: "two words"},
		"E bad lease \"x\" in line 1": {op: 'E', text: "bad lease \"x\" in line 1"},
		"K jobs/a 5 29580 2":          {op: 'K', key: "jobs/a", token: 5, lease: 29580, waits: 2},
		"L 0":                         {op: 'L'},
		"A k 7\r":                     {op: 'A', key: "k", token: 7},
	}
	for line, want := range good {
		got, err := parseAnswer([]byte(line))
		if err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", line, got, err, want)
		}
	}
	bad := []string{"", "A", "A k", "A k 0", "A k -1", "A k 18446744073709551616", "A k 1 2",
		"T", "T k x", "M k", "M k ", "R k 2", "R k", "N k yes", "S", "S boss - 0", "S active - x",
		"K k 1 2", "L", "L x", "X k", "AA k 1", "A  k 1", "A k\x01 1", "a k 1"}
	for _, line := range bad {
		if got, err := parseAnswer([]byte(line)); err == nil {
			t.Errorf("%q parsed as %+v", line, got)
		}
	}
}

func FuzzParseAnswer(f *testing.F) {
	for _, s := range []string{"A k 7", "M k -", "S active a:1 0", "K a 1 2 3", "E x", "L 5", "G k 5", "C k semaphore 3", "C k lock"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		_, _ = parseAnswer(line) // must not panic
	})
}

func TestDurations(t *testing.T) {
	for ms, want := range map[uint64]string{0: "0", 1: "0.001", 1500: "1.5", 30000: "30", 10: "0.01", 86400000: "86400"} {
		if got := string(appendSeconds(nil, ms)); got != want {
			t.Errorf("%d ms: %q, want %q", ms, got, want)
		}
	}
	if ms, _ := waitMs(10 * time.Microsecond); ms != 1 {
		t.Errorf("a 10µs wait is %d ms, want 1 (not 0, no limit)", ms)
	}
	if ms, _ := leaseMs(1999 * time.Microsecond); ms != 1 {
		t.Errorf("a 1.999ms lease is %d ms, want 1", ms)
	}
	if string(acquireLine("k", 1500, 0)) != "A k 1.5 0\n" || string(renewLine("k", 9, 30000)) != "N k 9 30\n" ||
		string(releaseLine("k", 9)) != "R k 9\n" || string(listLine(5, 100, "p/")) != "L 5 100 p/\n" {
		t.Error("request lines")
	}
}

// fake is a scripted server: every connection is handed to handle.
type fake struct {
	t      *testing.T
	l      net.Listener
	addr   string
	handle func(fc *fakeConn)
	mu     sync.Mutex
	conns  []*fakeConn
	wg     sync.WaitGroup
}

// fakeConn is one connection to a fake.
type fakeConn struct {
	nc net.Conn
	rd *bufio.Reader
	mu sync.Mutex
}

func newFake(t *testing.T, handle func(fc *fakeConn)) *fake {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{t: t, l: l, addr: l.Addr().String(), handle: handle}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			fc := &fakeConn{nc: nc, rd: bufio.NewReader(nc)}
			f.mu.Lock()
			f.conns = append(f.conns, fc)
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer nc.Close()
				f.handle(fc)
			}()
		}
	}()
	t.Cleanup(f.close)
	return f
}

func (f *fake) close() {
	_ = f.l.Close()
	f.mu.Lock()
	for _, fc := range f.conns {
		_ = fc.nc.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fake) accepted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// next reads one request line (without "\n"); false when the client
// closed the connection or after 10 s.
func (fc *fakeConn) next() (string, bool) {
	_ = fc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := fc.rd.ReadString('\n')
	if err != nil {
		return "", false
	}
	return strings.TrimSuffix(line, "\n"), true
}

func (fc *fakeConn) send(lines ...string) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for _, l := range lines {
		_, _ = fc.nc.Write([]byte(l + "\n"))
	}
}

// serveWith answers S itself and every other line with answer(line)
// (nothing when it returns nil).
func serveWith(answer func(fc *fakeConn, line string) []string) func(fc *fakeConn) {
	return func(fc *fakeConn) {
		for {
			line, ok := fc.next()
			if !ok {
				return
			}
			if line == "S" {
				fc.send("S active - 0")
				continue
			}
			fc.send(answer(fc, line)...)
		}
	}
}

func fields(line string) []string { return strings.Split(line, " ") }

func connectFake(t *testing.T, addrs []string, opts *Options) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Connect(ctx, addrs, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// connectOne connects with one connection only (the client keeps two for
// one address), so that every request shares it.
func connectOne(t *testing.T, addr string, opts *Options) *Client {
	t.Helper()
	s, err := resolve(opts)
	if err != nil {
		t.Fatal(err)
	}
	c, err := start(testCtx(t), s, []string{addr}, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Answers out of order go to the right requests: by key, and for one
// (op, key) to the oldest first.
func TestMatchingOutOfOrder(t *testing.T) {
	var mu sync.Mutex
	var held []string
	f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		mu.Lock()
		defer mu.Unlock()
		held = append(held, line)
		if len(held) < 4 {
			return nil
		}
		// A a, A b, A a, A b arrived (in some order): answer b first,
		// then a's two in order of their tokens.
		return []string{"A b 20", "A a 10", "A a 11", "T b"}
	}))
	// One connection only, so that all four share it.
	c := connectOne(t, f.addr, nil)
	ctx := testCtx(t)
	type res struct {
		key   string
		token uint64
		ok    bool
	}
	out := make(chan res, 4)
	for i, k := range []string{"a", "b", "a", "b"} {
		go func() {
			l, ok, err := c.Acquire(ctx, k, time.Second, 0)
			if err != nil {
				t.Error(err)
			}
			r := res{key: k, ok: ok}
			if ok {
				r.token = l.Token()
			}
			out <- r
		}()
		// One after the other on the wire.
		if i < 3 {
			waitForCond(t, func() bool { return c.PendingRequests() == i+1 })
		}
	}
	got := map[string][]uint64{}
	for i := 0; i < 4; i++ {
		r := <-out
		got[r.key] = append(got[r.key], r.token)
	}
	if len(got["a"]) != 2 || len(got["b"]) != 2 {
		t.Fatalf("answers: %v", got)
	}
	// The two b acquires: one granted 20, one timed out (token 0).
	if !(got["b"][0] == 20 && got["b"][1] == 0 || got["b"][0] == 0 && got["b"][1] == 20) {
		t.Fatalf("b: %v", got["b"])
	}
	if !(got["a"][0]+got["a"][1] == 21) {
		t.Fatalf("a: %v", got["a"])
	}
}

func waitForCond(t *testing.T, cond func() bool) {
	t.Helper()
	until := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(until) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two requests of one key with different ops: M answers the oldest
// whatever its op; R and A each their own.
func TestMatchingByOp(t *testing.T) {
	reqs := make(chan string, 10)
	f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		reqs <- line
		if strings.HasPrefix(line, "R ") {
			// The A before it is still waiting: answer R, then A.
			return []string{"R k 1", "A k 42"}
		}
		return nil
	}))
	c := connectOne(t, f.addr, nil)
	ctx := testCtx(t)
	acq := make(chan uint64, 1)
	go func() {
		l, err := c.Lock(ctx, "k", time.Second, 0)
		if err != nil {
			t.Error(err)
			acq <- 0
			return
		}
		acq <- l.Token()
	}()
	<-reqs
	ok, err := c.Release(ctx, "k", 5)
	if !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if tok := <-acq; tok != 42 {
		t.Fatalf("acquire got %d", tok)
	}
}

// An E ends the connection: its requests fail with ErrProtocol, and a
// reason that says "not allowed" is ErrNotAllowed; neither is retried.
func TestErrorLines(t *testing.T) {
	for reason, want := range map[string]error{
		"lock table full: 5 locks (--max-locks) in line 2":             ErrProtocol,
		"not allowed: alice may not lock b/x (access rules) in line 2": ErrNotAllowed,
	} {
		count := 0
		var mu sync.Mutex
		f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
			mu.Lock()
			count++
			mu.Unlock()
			return []string{"E " + reason}
		}))
		c := connectFake(t, []string{f.addr}, nil)
		_, err := c.Lock(testCtx(t), "b/x", time.Second, time.Second)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), reason) {
			t.Errorf("E %s: %v", reason, err)
		}
		mu.Lock()
		if count != 1 {
			t.Errorf("E %s: sent %d times, want once", reason, count)
		}
		mu.Unlock()
	}
}

// Malformed, over-long and unmatched answers are protocol errors.
func TestBrokenAnswers(t *testing.T) {
	for name, ans := range map[string]string{
		"malformed": "A k notanumber",
		"too long":  "A k " + strings.Repeat("1", maxAnswerLine),
		"unmatched": "R other 1",
		"H":         "H ok",
	} {
		f := newFake(t, serveWith(func(fc *fakeConn, line string) []string { return []string{ans} }))
		c := connectFake(t, []string{f.addr}, nil)
		_, err := c.Lock(testCtx(t), "k", time.Second, time.Second)
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// M names another node: the acquire goes there, and that node is
// preferred afterwards. M key - is retried with a growing delay, and
// ErrNoActiveNode ends it after the no-active timeout.
func TestFollowM(t *testing.T) {
	active := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		return []string{"A " + fields(line)[1] + " 77"}
	}))
	standby := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		return []string{"M " + fields(line)[1] + " " + active.addr}
	}))
	c := connectFake(t, []string{standby.addr}, nil)
	l, err := c.Lock(testCtx(t), "k", time.Second, time.Second)
	if err != nil || l.Token() != 77 {
		t.Fatalf("after M: %v %v", l, err)
	}
	if addrs := c.Addresses(); len(addrs) != 2 || addrs[1] != active.addr {
		t.Fatalf("addresses: %v", addrs)
	}

	var mu sync.Mutex
	var at []time.Time
	none := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		return []string{"M " + fields(line)[1] + " -"}
	}))
	c2 := connectFake(t, []string{none.addr}, &Options{NoActiveTimeout: 800 * time.Millisecond})
	start := time.Now()
	_, err = c2.Lock(testCtx(t), "k", time.Second, 0)
	if !errors.Is(err, ErrNoActiveNode) {
		t.Fatalf("M key -: %v", err)
	}
	if e := time.Since(start); e < 800*time.Millisecond || e > 1500*time.Millisecond {
		t.Fatalf("gave up after %v, bound 800ms", e)
	}
	mu.Lock()
	defer mu.Unlock()
	// 50, 100, 200, 400 ms between attempts.
	for i := 1; i < len(at) && i < 5; i++ {
		want := 50 * time.Millisecond << (i - 1)
		if gap := at[i].Sub(at[i-1]); gap < want || gap > want+150*time.Millisecond {
			t.Errorf("gap %d: %v, want about %v", i, gap, want)
		}
	}
}

// A standby names an active that refuses connections: the acquire is
// redirected until its wait (plus grace) runs out. No node said the wait
// ran out, so it is not ErrTimeout but, as in the Rust and Python clients,
// ErrConnection naming the node that could not be reached.
func TestWaitRunsOutWhileRedirected(t *testing.T) {
	gone := newFake(t, serveWith(func(fc *fakeConn, line string) []string { return nil }))
	named := gone.addr
	gone.close()
	var mu sync.Mutex
	acquires := 0
	standby := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		mu.Lock()
		acquires++
		mu.Unlock()
		return []string{"M " + fields(line)[1] + " " + named}
	}))
	// A short connect timeout: each follow of the refused node gives up
	// soon, and the wait runs out between attempts, not in a follow.
	c := connectFake(t, []string{standby.addr}, &Options{ConnectTimeout: 200 * time.Millisecond})
	start := time.Now()
	_, err := c.Lock(testCtx(t), "k", 5*time.Second, time.Second)
	if !errors.Is(err, ErrConnection) || errors.Is(err, ErrTimeout) {
		t.Fatalf("wait ran out while redirected: %v", err)
	}
	if !strings.Contains(err.Error(), "redirected to "+named+", which could not be reached") {
		t.Errorf("the error does not name %s: %v", named, err)
	}
	if e := time.Since(start); e < 900*time.Millisecond || e > 2200*time.Millisecond {
		t.Errorf("ended after %v, wait 1s", e)
	}
	mu.Lock()
	defer mu.Unlock()
	if acquires < 2 {
		t.Errorf("%d acquires sent, want the M followed again", acquires)
	}
}

// A try-lock (a 1 ms wait) redirected by M asks the node the M names,
// though its wait ran out while that node was dialled: a node that
// redirects decided nothing.
func TestRedirectedTryLockAsksTheNamedNode(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	// Its hello answered after 20 ms: the dial outlasts the try's wait.
	active := newFake(t, func(fc *fakeConn) {
		for {
			line, ok := fc.next()
			if !ok {
				return
			}
			if line == "S" {
				time.Sleep(20 * time.Millisecond)
				fc.send("S active - 0")
				continue
			}
			mu.Lock()
			asked = append(asked, line)
			mu.Unlock()
			fc.send("A " + fields(line)[1] + " 77")
		}
	})
	standby := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		return []string{"M " + fields(line)[1] + " " + active.addr}
	}))
	c := connectFake(t, []string{standby.addr}, nil)
	l, ok, err := c.TryLock(testCtx(t), "k", 5*time.Second)
	if err != nil || !ok || l.Token() != 77 {
		t.Fatalf("a try-lock redirected to a free node: %v %v %v", l, ok, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != "A k 5 0.001" {
		t.Fatalf("the named node was asked %q", asked)
	}
}

// A try-lock met by M key - (a node that just stepped down) asks again
// after the back-off, with the shortest wait, rather than taking the lock
// for held or giving up.
func TestTryLockAfterMDashAsksAgain(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	node := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, line)
		if len(asked) == 1 {
			return []string{"M " + fields(line)[1] + " -"}
		}
		return []string{"A " + fields(line)[1] + " 7"}
	}))
	c := connectFake(t, []string{node.addr}, nil)
	start := time.Now()
	l, ok, err := c.TryLock(testCtx(t), "k", 5*time.Second)
	took := time.Since(start)
	if err != nil || !ok || l.Token() != 7 {
		t.Fatalf("after M k -: %v %v %v", l, ok, err)
	}
	if took < 45*time.Millisecond || took > time.Second {
		t.Errorf("granted after %v, want about the 50 ms back-off", took)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0] != "A k 5 0.001" || asked[1] != "A k 5 0.001" {
		t.Fatalf("asked %q", asked)
	}
}

// A node that answers the hello and then nothing: the liveness probe finds
// the connection dead within the probe interval plus timeout, the acquire
// moves to the next connection, and after every connection failed it,
// ErrConnection.
func TestSilentNodeIsProbed(t *testing.T) {
	f := newFake(t, func(fc *fakeConn) {
		if line, ok := fc.next(); ok && line == "S" {
			fc.send("S active - 0") // the hello, then silence
		}
		for {
			if _, ok := fc.next(); !ok {
				return
			}
		}
	})
	c := connectFake(t, []string{f.addr}, &Options{ProbeInterval: 200 * time.Millisecond, ProbeTimeout: 200 * time.Millisecond})
	start := time.Now()
	_, err := c.Lock(testCtx(t), "k", time.Second, 0)
	if !errors.Is(err, ErrConnection) || !strings.Contains(err.Error(), "stopped answering") {
		t.Fatalf("silent node: %v", err)
	}
	// Two connections, each found dead within 400 ms (plus scheduling).
	if e := time.Since(start); e < 400*time.Millisecond || e > 1500*time.Millisecond {
		t.Fatalf("took %v", e)
	}
}

// An acquire with a wait ends by the wait plus the grace whatever the node
// does, naming the node.
func TestAcquireDeadline(t *testing.T) {
	// Answers probes but never the acquire.
	f := newFake(t, serveWith(func(fc *fakeConn, line string) []string { return nil }))
	c := connectFake(t, []string{f.addr}, &Options{AcquireGrace: 300 * time.Millisecond, ProbeInterval: time.Hour})
	start := time.Now()
	_, err := c.Lock(testCtx(t), "k", time.Second, 200*time.Millisecond)
	if !errors.Is(err, ErrConnection) || !strings.Contains(err.Error(), "did not answer the acquire") {
		t.Fatalf("%v", err)
	}
	if e := time.Since(start); e < 500*time.Millisecond || e > 900*time.Millisecond {
		t.Fatalf("took %v, want wait+grace = 500ms", e)
	}
}

// A release whose connections keep closing is retried every RetryEvery for
// RetryFor, then ErrConnection.
func TestReleaseRetries(t *testing.T) {
	var mu sync.Mutex
	var at []time.Time
	f := newFake(t, func(fc *fakeConn) {
		for {
			line, ok := fc.next()
			if !ok {
				return
			}
			if line == "S" {
				fc.send("S active - 0")
				continue
			}
			mu.Lock()
			at = append(at, time.Now())
			mu.Unlock()
			return // closes the connection: the release is lost
		}
	})
	c := connectFake(t, []string{f.addr}, &Options{RedialInterval: 10 * time.Millisecond, RetryFor: time.Second})
	start := time.Now()
	_, err := c.Release(testCtx(t), "k", 5)
	if !errors.Is(err, ErrConnection) {
		t.Fatalf("%v", err)
	}
	if e := time.Since(start); e < 800*time.Millisecond || e > 1300*time.Millisecond {
		t.Fatalf("gave up after %v, RetryFor 1s", e)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(at) < 3 || len(at) > 7 {
		t.Fatalf("%d attempts in 1s at 200ms", len(at))
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < 190*time.Millisecond {
			t.Errorf("attempt %d came %v after the previous", i, gap)
		}
	}
}

// At most MaxWaitingAcquires acquires wait on one connection; the rest
// wait in the client, in order; releases are not held behind them.
func TestLocalQueueing(t *testing.T) {
	var mu sync.Mutex
	waiting, owed, most := 0, 0, 0
	f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		mu.Lock()
		defer mu.Unlock()
		switch fields(line)[0] {
		case "A":
			if owed > 0 {
				owed--
				return []string{"T k"}
			}
			waiting++
			most = max(most, waiting)
			return nil
		case "R":
			// Frees one waiter: answer the oldest A with T (or the next
			// one to come).
			if waiting == 0 {
				owed++
				return []string{"R k 1"}
			}
			waiting--
			return []string{"R k 1", "T k"}
		}
		return nil
	}))
	c := connectOne(t, f.addr, &Options{MaxWaitingAcquires: 2})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := c.Acquire(ctx, "k", time.Second, 0); err != nil {
				t.Error(err)
			}
		}()
	}
	waitForCond(t, func() bool { return c.PendingRequests() == 2 })
	for i := 0; i < 5; i++ {
		// Each release goes out at once although acquires queue.
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		if ok, err := c.Release(rctx, "k", 9); !ok || err != nil {
			t.Fatalf("release %d: %v %v (%s)", i, ok, err, c.whyNoConnection())
		}
		cancel()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if most != 2 {
		t.Fatalf("at most %d acquires waited on the connection, want 2", most)
	}
}

// A connection enters the rotation only after its node answered the hello:
// a node that accepts and says nothing fails Connect within the probe
// timeout.
func TestHelloRequired(t *testing.T) {
	f := newFake(t, func(fc *fakeConn) { _, _ = fc.next(); time.Sleep(2 * time.Second) })
	start := time.Now()
	_, err := Connect(testCtx(t), []string{f.addr}, &Options{ProbeTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrConnection) || !strings.Contains(err.Error(), "did not answer S") {
		t.Fatalf("%v", err)
	}
	if e := time.Since(start); e > time.Second {
		t.Fatalf("took %v", e)
	}
}

// A dropped connection is redialled: every RedialInterval after the
// previous dial.
func TestRedial(t *testing.T) {
	f := newFake(t, func(fc *fakeConn) {
		if line, ok := fc.next(); ok && line == "S" {
			fc.send("S active - 0")
		}
		time.Sleep(50 * time.Millisecond) // then close
	})
	c := connectFake(t, []string{f.addr}, &Options{RedialInterval: 300 * time.Millisecond})
	time.Sleep(1000 * time.Millisecond)
	// Two slots, each dialled at 0, 300, 600, 900 ms: 8, give or take one each.
	if n := f.accepted(); n < 6 || n > 10 {
		t.Fatalf("%d dials in 1s with two slots redialling every 300ms", n)
	}
	_ = c
}

// M answers the oldest pending request of its key whatever its op: here a
// release sent before an acquire of the same key. The release follows the
// M to the node it names; the acquire stays and is answered where it was.
func TestMAnswersTheOldestOfAnyOp(t *testing.T) {
	other := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		switch fields(line)[0] {
		case "R":
			return []string{"R k 1"}
		case "A":
			return []string{"A k 6"}
		}
		return nil
	}))
	seenA := make(chan struct{})
	f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		if fields(line)[0] == "A" {
			close(seenA)
			// The R came first: M is its answer; then the A's grant.
			return []string{"M k " + other.addr, "A k 5"}
		}
		return nil
	}))
	c := connectOne(t, f.addr, nil)
	ctx := testCtx(t)
	released := make(chan bool, 1)
	go func() {
		ok, err := c.Release(ctx, "k", 9)
		if err != nil {
			t.Error(err)
		}
		released <- ok
	}()
	waitForCond(t, func() bool { return c.PendingRequests() == 1 })
	acq := make(chan uint64, 1)
	go func() {
		l, err := c.Lock(ctx, "k", time.Second, 0)
		if err != nil {
			t.Error(err)
			acq <- 0
			return
		}
		acq <- l.Token()
	}()
	<-seenA
	if ok := <-released; !ok {
		t.Fatal("the release, answered M, did not complete at the named node")
	}
	if tok := <-acq; tok != 5 {
		t.Fatalf("the acquire got token %d, want 5 (from the node it was sent to)", tok)
	}
}
