package ringlock

// Shared locks and semaphores against fake servers: the G and C answer
// parser and its bounds, request lines, matching by op and key, malformed
// answers, bad limits, and the E that refuses an exclusive acquire of a
// semaphore.

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseKindAnswers(t *testing.T) {
	good := map[string]answer{
		"G k 17":                   {op: 'G', key: "k", token: 17},
		"G k 0":                    {op: 'G', key: "k"},
		"C k 18446744073709551615": {op: 'C', key: "k", token: 18446744073709551615},
		"C k 0":                    {op: 'C', key: "k"},
		"G k semaphore 3":          {op: 'G', key: "k", wrong: true, limit: 3},
		"C k semaphore 65536":      {op: 'C', key: "k", wrong: true, limit: 65536},
		"C k semaphore 0001":       {op: 'C', key: "k", wrong: true, limit: 1},
		"C k lock":                 {op: 'C', key: "k", wrong: true},
		"C k\x80 lock":             {op: 'C', key: "k\x80", wrong: true},
		"G " + strings.Repeat("x", MaxKeyLen) + " 5": {op: 'G', key: strings.Repeat("x", MaxKeyLen), token: 5},
	}
	for line, want := range good {
		got, err := parseAnswer([]byte(line))
		if err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", line, got, err, want)
		}
	}
	bad := []string{"G k lock", "G k", "C k", "C k semaphore 0", "C k semaphore 65537", "G k semaphore",
		"G k semaphore -1", "G k semaphore 99999999999999999999999", "C k lock 1", "G k -1", "G k x",
		"C k 18446744073709551616", "G  k 1", "G k 1 2", "C k semaphore 2 3", "G k Semaphore 2",
		"G " + strings.Repeat("x", MaxKeyLen+1) + " 5", "G k\x7f 1", "GG k 1", "g k 1"}
	for _, line := range bad {
		if got, err := parseAnswer([]byte(line)); err == nil {
			t.Errorf("%q parsed as %+v", line, got)
		}
	}
}

func TestKindLines(t *testing.T) {
	for want, line := range map[string][]byte{
		"A k 1.5 0\n":         kindLine(Exclusive, "k", 1500, 0),
		"G k 1.5 0\n":         kindLine(Shared, "k", 1500, 0),
		"C k 7 30 0.25\n":     kindLine(Permits(7), "k", 30000, 250),
		"C k 65536 1 0.001\n": kindLine(Permits(MaxPermits), "k", 1000, 1),
	} {
		if string(line) != want {
			t.Errorf("%q, want %q", line, want)
		}
	}
	if Exclusive != (Kind{}) || Exclusive.String() != "exclusive" || Shared.String() != "shared" ||
		Permits(3).String() != "permits(3)" || Permits(3).Limit() != 3 || Shared.Limit() != 0 || !Shared.IsShared() {
		t.Error("kinds")
	}
}

func TestSemaphoreRefusalReason(t *testing.T) {
	for reason, want := range map[string]struct {
		quoted string
		limit  int
	}{
		`key "sem" is a semaphore of 2 permits: acquire it with C in line 3`:        {"sem", 2},
		`key "a\x22b" is a semaphore of 65536 permits: acquire it with C in line 9`: {`a\x22b`, 65536},
	} {
		q, limit, ok := semaphoreRefusal(reason)
		if !ok || q != want.quoted || limit != want.limit {
			t.Errorf("%q: %q %d %v", reason, q, limit, ok)
		}
	}
	for _, reason := range []string{
		`lock table full: 5 locks (--max-locks) in line 2`,
		`key "sem" is a semaphore of 0 permits: acquire it with C in line 3`,
		`key "sem" is a semaphore of 65537 permits: acquire it with C in line 3`,
		`key "sem" is a semaphore of +2 permits: acquire it with C in line 3`,
		`key "sem" is a semaphore of  permits: acquire it with C in line 3`,
		`key "sem is a semaphore of 2 permits`,
		`not allowed: identity "x" may not lock "key "s" is a semaphore of 2 permits: acquire it with C"`,
	} {
		if _, _, ok := semaphoreRefusal(reason); ok {
			t.Errorf("%q read as a semaphore refusal", reason)
		}
	}
	long := strings.Repeat("k", 41)
	for key, want := range map[string]string{
		"sem":      "sem",
		`a"b\c`:    `a\x22b\x5cc`,
		"\x80\xff": `\x80\xff`,
		long:       strings.Repeat("k", 40) + "...",
	} {
		if got := quoteKey(key); got != want {
			t.Errorf("quoteKey(%q) = %q, want %q", key, got, want)
		}
	}
}

// G and C answers go to the G and C of their key, never to an A of it,
// and each kind's timeout and refusal to its own request.
func TestKindMatching(t *testing.T) {
	reqs := make(chan string, 10)
	f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		reqs <- line
		if strings.HasPrefix(line, "C ") {
			// A, G and C of k are waiting: answer C first, then G,
			// then A, each with a token of its own.
			return []string{"C k 30", "G k 20", "A k 10"}
		}
		return nil
	}))
	c := connectOne(t, f.addr, nil)
	ctx := testCtx(t)
	out := make(chan string, 3)
	for i, kind := range []Kind{Exclusive, Shared, Permits(2)} {
		go func() {
			l, err := c.LockKind(ctx, "k", kind, time.Second, 0)
			if err != nil {
				t.Error(err)
				out <- ""
				return
			}
			out <- l.String()
		}()
		<-reqs
		waitForCond(t, func() bool { return c.PendingRequests() == i+1 })
	}
	got := map[string]bool{}
	for i := 0; i < 3; i++ {
		got[<-out] = true
	}
	for _, want := range []string{`ringlock.Lock{"k", token 10}`, `ringlock.Lock{"k", shared, token 20}`, `ringlock.Lock{"k", permits(2), token 30}`} {
		if !got[want] {
			t.Errorf("no %s among %v", want, got)
		}
	}
}

// G key 0 is the shared acquire's timeout; the refusals are a
// *WrongKindError with the live limit; M answers a G like any request.
func TestKindAnswers(t *testing.T) {
	f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		switch f := fields(line); f[1] {
		case "out":
			return []string{f[0] + " out 0"}
		case "sem":
			return []string{f[0] + " sem semaphore 4"}
		case "lk":
			return []string{"C lk lock"}
		}
		return nil
	}))
	c := connectFake(t, []string{f.addr}, nil)
	ctx := testCtx(t)
	if _, err := c.LockKind(ctx, "out", Shared, time.Second, time.Second); !errors.Is(err, ErrTimeout) {
		t.Errorf("G out 0: %v", err)
	}
	if l, ok, err := c.AcquireKind(ctx, "out", Permits(2), time.Second, time.Second); l != nil || ok || err != nil {
		t.Errorf("C out 0: %v %v %v", l, ok, err)
	}
	for _, kind := range []Kind{Shared, Permits(2)} {
		var wk *WrongKindError
		_, err := c.LockKind(ctx, "sem", kind, time.Second, time.Second)
		if !errors.As(err, &wk) || wk.Limit != 4 || wk.Asked != kind || !strings.Contains(err.Error(), "semaphore of 4") {
			t.Errorf("%v of a semaphore of 4: %v", kind, err)
		}
	}
	var wk *WrongKindError
	if _, _, err := c.TryLockKind(ctx, "lk", Permits(2), time.Second); !errors.As(err, &wk) || wk.Limit != 0 || !errors.Is(err, ErrWrongKind) {
		t.Errorf("C lk lock: %v", err)
	}
}

// A malformed G or C answer is refused: ErrProtocol for what was pending
// on that connection, no crash, and the client goes on with a new
// connection.
func TestMalformedKindAnswers(t *testing.T) {
	for _, ans := range []string{"G k lock", "C k semaphore 0", "G k semaphore 65537", "C k -1",
		"G k 1 2", "C k semaphore", "G k " + strings.Repeat("9", 30), "C k lock lock"} {
		var mu sync.Mutex
		broken := true
		f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
			mu.Lock()
			defer mu.Unlock()
			if broken {
				broken = false
				return []string{ans}
			}
			return []string{strings.Fields(line)[0] + " k 5"}
		}))
		c := connectOne(t, f.addr, &Options{RedialInterval: 20 * time.Millisecond})
		ctx := testCtx(t)
		kind := Shared
		if ans[0] == 'C' {
			kind = Permits(2)
		}
		if _, err := c.LockKind(ctx, "k", kind, time.Second, time.Second); !errors.Is(err, ErrProtocol) {
			t.Errorf("%q: %v", ans, err)
		}
		l, err := c.LockKind(ctx, "k", kind, time.Second, 2*time.Second)
		if err != nil || l.Token() != 5 {
			t.Errorf("%q: the next acquire: %v %v", ans, l, err)
		}
	}
}

// Limits out of range, and an unknown Kind, are refused before anything
// is sent.
func TestBadLimitsAreNotSent(t *testing.T) {
	var mu sync.Mutex
	var sent []string
	f := newFake(t, serveWith(func(fc *fakeConn, line string) []string {
		mu.Lock()
		sent = append(sent, line)
		mu.Unlock()
		return []string{"C k 5"}
	}))
	c := connectOne(t, f.addr, nil)
	ctx := testCtx(t)
	for _, kind := range []Kind{Permits(0), Permits(-3), Permits(MaxPermits + 1), {op: 'X'}} {
		if _, err := c.LockKind(ctx, "k", kind, time.Second, 0); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%v: %v", kind, err)
		}
		if _, err := c.LockRenewingKind(ctx, "k", kind, time.Second, 0); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("renewing %v: %v", kind, err)
		}
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 0 {
		t.Fatalf("sent %q", sent)
	}
}

// The E that refuses an exclusive acquire of a semaphore closes the
// connection: that acquire fails with a *WrongKindError (not retried), the
// other requests on the connection learn that it closed (a release is
// sent again on the next connection and succeeds).
func TestSemaphoreRefusalOfAnExclusiveAcquire(t *testing.T) {
	var mu sync.Mutex
	conns := 0
	f := newFake(t, func(fc *fakeConn) {
		mu.Lock()
		conns++
		first := conns == 1
		mu.Unlock()
		for {
			line, ok := fc.next()
			if !ok {
				return
			}
			switch {
			case line == "S":
				fc.send("S active - 0")
			case first && strings.HasPrefix(line, `A s"em `):
				// Grants decided before the broken line are sent first.
				fc.send("A other 7", `E key "s\x22em" is a semaphore of 2 permits: acquire it with C in line 4`)
				return
			case first:
				// The other requests wait on the first connection.
			case strings.HasPrefix(line, "R "):
				fc.send("R " + fields(line)[1] + " 1")
			}
		}
	})
	c := connectOne(t, f.addr, &Options{RedialInterval: 20 * time.Millisecond})
	ctx := testCtx(t)
	other := make(chan error, 1)
	go func() {
		l, err := c.Lock(ctx, "other", time.Second, 0)
		if err == nil && l.Token() != 7 {
			err = errors.New("token " + l.String())
		}
		other <- err
	}()
	released := make(chan error, 1)
	waitForCond(t, func() bool { return c.PendingRequests() == 1 })
	go func() {
		ok, err := c.Release(ctx, "held", 9)
		if err == nil && !ok {
			err = errors.New("not released")
		}
		released <- err
	}()
	waitForCond(t, func() bool { return c.PendingRequests() == 2 })
	var wk *WrongKindError
	_, err := c.Lock(ctx, `s"em`, time.Second, time.Second)
	if !errors.As(err, &wk) || wk.Limit != 2 || wk.Asked != Exclusive || !strings.Contains(wk.Reason, "is a semaphore of 2") {
		t.Fatalf("an exclusive acquire of a semaphore: %v", err)
	}
	if kindOf(err) != ErrWrongKind {
		t.Fatalf("kind %v", kindOf(err))
	}
	if err := <-other; err != nil {
		t.Fatalf("the grant decided before the E: %v", err)
	}
	if err := <-released; err != nil {
		t.Fatalf("a release pending on the refused connection: %v", err)
	}
}
