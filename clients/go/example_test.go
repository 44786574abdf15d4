package ringlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"ringlock.dev/ringlock"
)

// The cluster's peer list, as the ringlock command line reads it
// (RINGLOCK_SERVERS=db1:7171,db2:7171,db3:7171); the tests set it to a node
// they started.
func servers() []string { return strings.Split(os.Getenv("RINGLOCK_SERVERS"), ",") }

// Take a lock, work under it with its fencing token, release it.
func Example() {
	ctx := context.Background()
	client, err := ringlock.Connect(ctx, servers(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	// Wait at most 5 s in the queue; hold for at most 30 s unless renewed.
	lock, err := client.Lock(ctx, "example/report", 30*time.Second, 5*time.Second)
	if errors.Is(err, ringlock.ErrTimeout) {
		fmt.Println("someone else is writing the report")
		return
	} else if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("locked, token above 0:", lock.Token() > 0)
	released, err := lock.Release(ctx)
	fmt.Println("released:", released, err)
	// Output:
	// locked, token above 0: true
	// released: true <nil>
}

// One attempt, like flock -n: (nil, false, nil) when someone else holds
// the lock.
func ExampleClient_TryLock() {
	ctx := context.Background()
	client, err := ringlock.Connect(ctx, servers(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	first, ok, err := client.TryLock(ctx, "example/nightly", time.Minute)
	fmt.Println("first:", ok, err)
	_, ok, err = client.TryLock(ctx, "example/nightly", time.Minute)
	fmt.Println("second:", ok, err)
	_, _ = first.Release(ctx)
	// Output:
	// first: true <nil>
	// second: false <nil>
}

// A lock that renews itself while the work runs; the work stops when the
// lock is lost (here: someone releases it with its token, as an operator
// would with `ringlock release KEY TOKEN`).
func ExampleClient_LockRenewing() {
	ctx := context.Background()
	client, err := ringlock.Connect(ctx, servers(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	lock, err := client.LockRenewing(ctx, "example/job", 3*time.Second, 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, _ = client.Release(ctx, "example/job", lock.Token())
	}()

	// The work: lock.Context() ends when the lock is lost.
	work := func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(50 * time.Millisecond): // one step of work
			}
		}
	}
	err = work(lock.Context())
	fmt.Println("work stopped, lock lost:", errors.Is(err, ringlock.ErrLockLost))
	// Output:
	// work stopped, lock lost: true
}

// The fencing token protects a resource even when two holders overlap (a
// holder paused past its lease, a failover): the resource remembers the
// highest token it has seen and refuses older ones.
func ExampleLock_Token() {
	ctx := context.Background()
	client, err := ringlock.Connect(ctx, servers(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	store := &fencedStore{}
	old, _ := client.Lock(ctx, "example/store", 50*time.Millisecond, 0)
	time.Sleep(100 * time.Millisecond) // the old holder pauses past its lease
	newer, _ := client.Lock(ctx, "example/store", time.Minute, time.Second)
	fmt.Println("newer holder writes:", store.Write(newer.Token(), "v2"))
	fmt.Println("old holder writes:", store.Write(old.Token(), "v1"))
	_, _ = newer.Release(ctx)
	// Output:
	// newer holder writes: <nil>
	// old holder writes: token is older than one already seen
}

// fencedStore is a resource that refuses writes with an older token than
// the newest it has seen.
type fencedStore struct {
	mu      sync.Mutex
	highest uint64
	value   string
}

func (s *fencedStore) Write(token uint64, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return errors.New("token is older than one already seen")
	}
	s.highest, s.value = token, value
	return nil
}

// List the locks a node holds (what `ringlock locks` shows), page by page.
func ExampleListLocks() {
	ctx := context.Background()
	client, err := ringlock.Connect(ctx, servers(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	a, _ := client.Lock(ctx, "example/list/a", time.Minute, 0)
	b, _ := client.Lock(ctx, "example/list/b", time.Minute, 0)

	count := 0
	for cursor := uint64(0); ; {
		locks, next, err := ringlock.ListLocks(ctx, servers()[0], nil, "example/list/", cursor, 100, 3*time.Second)
		if err != nil {
			fmt.Println(err)
			return
		}
		count += len(locks)
		if next == 0 {
			break
		}
		cursor = next
	}
	fmt.Println(count, "locks under example/list/")
	_, _ = a.Release(ctx)
	_, _ = b.Release(ctx)
	// Output:
	// 2 locks under example/list/
}

// Readers hold a key together; a writer waits until every reader has
// released it (and a reader that comes while a writer waits waits behind
// the writer). Every grant has a fencing token of its own.
func ExampleClient_LockKind() {
	ctx := context.Background()
	client, err := ringlock.Connect(ctx, servers(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	// Two readers at once.
	r1, err := client.LockKind(ctx, "example/config", ringlock.Shared, 30*time.Second, 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	r2, err := client.LockKind(ctx, "example/config", ringlock.Shared, 30*time.Second, 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("two readers:", r1.Kind(), r2.Kind(), r2.Token() > r1.Token())
	// A writer does not get the key while they read.
	_, ok, err := client.TryLock(ctx, "example/config", 30*time.Second)
	fmt.Println("a writer beside them:", ok, err)
	_, _ = r1.Release(ctx)
	_, _ = r2.Release(ctx)
	w, ok, err := client.TryLock(ctx, "example/config", 30*time.Second)
	fmt.Println("a writer once they are gone:", ok, err)
	fmt.Println("its token is above theirs:", w.Token() > r2.Token())
	_, _ = w.Release(ctx)
	// Output:
	// two readers: shared shared true
	// a writer beside them: false <nil>
	// a writer once they are gone: true <nil>
	// its token is above theirs: true
}

// A counting semaphore: at most 2 of the 5 workers run at once, across
// every process that asks for the key with the same limit.
func ExamplePermits() {
	ctx := context.Background()
	client, err := ringlock.Connect(ctx, servers(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	var running, most atomic.Int32
	var wg sync.WaitGroup
	for worker := 1; worker <= 5; worker++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One of 2 permits, renewed while the work runs; wait at
			// most a minute for one.
			permit, err := client.LockRenewingKind(ctx, "example/migrations", ringlock.Permits(2), 10*time.Second, time.Minute)
			if err != nil {
				fmt.Println(err)
				return
			}
			defer permit.Release(context.Background())
			now := running.Add(1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			select { // the work, which stops if the permit is lost
			case <-time.After(50 * time.Millisecond):
			case <-permit.Done():
			}
			running.Add(-1)
		}()
	}
	wg.Wait()
	fmt.Println("never more than 2 at once:", most.Load() <= 2)

	// The key is a semaphore of 2 while it has holders: another limit,
	// a shared or an exclusive acquire is refused, and nothing changes.
	held, _ := client.LockKind(ctx, "example/migrations", ringlock.Permits(2), 10*time.Second, 0)
	_, err = client.LockKind(ctx, "example/migrations", ringlock.Permits(3), 10*time.Second, 0)
	var wrong *ringlock.WrongKindError
	fmt.Println(errors.Is(err, ringlock.ErrWrongKind), errors.As(err, &wrong) && wrong.Limit == 2)
	_, _ = held.Release(ctx)
	// Output:
	// never more than 2 at once: true
	// true true
}
