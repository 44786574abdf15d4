package ringlock_test

import (
	"errors"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

func TestLockReleaseAndTokensGrow(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 20*time.Second)
	if got := c.Connections(); got != 2 {
		t.Fatalf("one address: %d connections, want 2", got)
	}
	l, err := c.Lock(ctx, "basic", 10*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() == 0 || l.Key() != "basic" {
		t.Fatalf("bad lock %v", l)
	}
	// Held: a second lock waits its wait and times out.
	start := time.Now()
	_, err = c.Lock(ctx, "basic", 10*time.Second, 300*time.Millisecond)
	if !errors.Is(err, ringlock.ErrTimeout) {
		t.Fatalf("second lock: %v, want ErrTimeout", err)
	}
	if e := time.Since(start); e < 300*time.Millisecond || e > 1300*time.Millisecond {
		t.Fatalf("the wait of 300ms took %v", e)
	}
	got, ok, err := c.TryLock(ctx, "basic", time.Second)
	if got != nil || ok || err != nil {
		t.Fatalf("TryLock of a held lock: %v %v %v", got, ok, err)
	}
	released, err := l.Release(ctx)
	if !released || err != nil {
		t.Fatalf("release: %v %v", released, err)
	}
	again, err := l.Release(ctx)
	if again || err != nil {
		t.Fatalf("second release: %v %v, want false", again, err)
	}
	l2, ok, err := c.TryLock(ctx, "basic", time.Second)
	if !ok || err != nil {
		t.Fatalf("TryLock of a free lock: %v %v", ok, err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token did not grow: %d then %d", l.Token(), l2.Token())
	}
	renewed, err := l2.Renew(ctx, 5*time.Second)
	if !renewed || err != nil {
		t.Fatalf("renew: %v %v", renewed, err)
	}
	if _, err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidArguments(t *testing.T) {
	n := startSingle(t)
	c := connect(t, []string{n.addr}, nil)
	ctx := ctxFor(t, 5*time.Second)
	for _, key := range []string{"", "a b", "tab\there", string(make([]byte, 251)), "x\x7f"} {
		if _, err := c.Lock(ctx, key, time.Second, 0); !errors.Is(err, ringlock.ErrInvalidArgument) {
			t.Errorf("key %q: %v", key, err)
		}
	}
	if _, err := c.Lock(ctx, "k", 0, 0); !errors.Is(err, ringlock.ErrInvalidArgument) {
		t.Errorf("lease 0: %v", err)
	}
	if _, err := c.Lock(ctx, "k", 86401*time.Second, 0); !errors.Is(err, ringlock.ErrInvalidArgument) {
		t.Errorf("lease too long: %v", err)
	}
	if _, err := c.Lock(ctx, "k", time.Second, -time.Second); !errors.Is(err, ringlock.ErrInvalidArgument) {
		t.Errorf("negative wait: %v", err)
	}
	if _, err := c.Release(ctx, "k", 0); !errors.Is(err, ringlock.ErrInvalidArgument) {
		t.Errorf("token 0: %v", err)
	}
	if _, err := ringlock.Connect(ctx, nil, nil); !errors.Is(err, ringlock.ErrInvalidArgument) {
		t.Errorf("no address: %v", err)
	}
	_ = c.Close()
	if _, err := c.Lock(ctx, "k", time.Second, 0); !errors.Is(err, ringlock.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}
