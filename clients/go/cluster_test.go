package ringlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

// Three nodes; 16 goroutines contend for one key through one client; the
// active node is killed with SIGKILL. Every goroutine keeps going (each
// gets the lock again after the failover), fencing tokens increase (per
// goroutine, and every token granted after the failover is above every
// token granted before it), and nothing hangs: every call has a deadline,
// and the test checks how long each took.
func TestClusterFailoverUnderContention(t *testing.T) {
	cl := startCluster(t, 3)
	c := connect(t, cl.addrs, nil)
	ctx := ctxFor(t, 60*time.Second)

	const workers = 16
	var (
		mu        sync.Mutex
		maxBefore uint64 // highest token granted before the kill
		minAfter  uint64 // lowest token granted after the failover settled
		killed    atomic.Bool
		settled   atomic.Bool
		slowest   time.Duration
		errs      = map[string]int{}
		afterKill [workers]int
		grants    atomic.Int64
		stopAt    = make(chan struct{})
		wg        sync.WaitGroup
	)
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for {
				select {
				case <-stopAt:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				start := time.Now()
				l, err := c.Lock(cctx, "contended", 2*time.Second, 5*time.Second)
				took := time.Since(start)
				cancel()
				mu.Lock()
				slowest = max(slowest, took)
				if err != nil {
					kind := "other"
					for _, k := range []error{ringlock.ErrTimeout, ringlock.ErrConnection, ringlock.ErrNoActiveNode} {
						if errors.Is(err, k) {
							kind = k.Error()
						}
					}
					errs[kind]++
					mu.Unlock()
					if kind == "other" {
						t.Errorf("worker %d: %v", g, err)
						return
					}
					continue
				}
				if l.Token() <= last {
					t.Errorf("worker %d: token %d after %d", g, l.Token(), last)
				}
				last = l.Token()
				switch {
				case !killed.Load():
					maxBefore = max(maxBefore, l.Token())
				case settled.Load():
					afterKill[g]++
					if minAfter == 0 || l.Token() < minAfter {
						minAfter = l.Token()
					}
				}
				mu.Unlock()
				grants.Add(1)
				time.Sleep(time.Millisecond) // "work" under the lock
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				start = time.Now()
				_, err = l.Release(rctx)
				rcancel()
				if took := time.Since(start); took > 6*time.Second {
					t.Errorf("worker %d: release took %v", g, took)
				}
				if err != nil && !errors.Is(err, ringlock.ErrConnection) && !errors.Is(err, ringlock.ErrNoActiveNode) {
					t.Errorf("worker %d: release: %v", g, err)
				}
			}
		}()
	}
	waitFor(t, "grants before the kill", func() bool { return grants.Load() >= 50 })
	killed.Store(true)
	cl.nodes[0].signal(syscall.SIGKILL)
	killedAt := time.Now()
	cl.waitSettled(1, []int{1, 2}, 10*time.Second)
	settled.Store(true)
	// Every goroutine gets the lock again.
	until := time.Now().Add(25 * time.Second)
	for {
		mu.Lock()
		all := true
		for _, n := range afterKill {
			all = all && n > 0
		}
		mu.Unlock()
		if all {
			break
		}
		if time.Now().After(until) {
			mu.Lock()
			t.Errorf("not every goroutine got the lock after the failover: %v (errors %v)", afterKill, errs)
			mu.Unlock()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stopAt)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("workers did not stop within 20s: something hangs")
	}
	mu.Lock()
	defer mu.Unlock()
	if minAfter <= maxBefore {
		t.Errorf("a token after the failover (%d) is not above every token before it (%d)", minAfter, maxBefore)
	}
	// Each Lock is bounded by its wait (5 s) plus the grace (1 s).
	if slowest > 6500*time.Millisecond {
		t.Errorf("the slowest Lock took %v", slowest)
	}
	t.Logf("%d grants; failover settled %v after the kill; errors %v; after it, grants per goroutine %v; slowest Lock %v",
		grants.Load(), time.Since(killedAt), errs, afterKill, slowest)
}
