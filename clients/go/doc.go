// Package ringlock is the official Go client of ringlock, a distributed
// lock server with FIFO fairness and fencing tokens.
//
// Connect to the cluster's peer list, take a lock, pass its fencing token
// to what the lock protects, release it:
//
//	client, err := ringlock.Connect(ctx, []string{"db1:7171", "db2:7171", "db3:7171"}, nil)
//	if err != nil { ... }
//	defer client.Close()
//	lock, err := client.Lock(ctx, "nightly-report", 30*time.Second, 10*time.Second)
//	if errors.Is(err, ringlock.ErrTimeout) { ... } // the wait ran out
//	defer lock.Release(ctx)
//	writeReport(lock.Token())
//
// Besides exclusive locks, a key can be held shared (a read/write lock)
// or as a counting semaphore: LockKind, TryLockKind, AcquireKind and
// LockRenewingKind take a Kind (Exclusive, Shared or Permits(n)), and each
// shared grant and permit has its own fencing token, lease, renewal and
// loss signal. An acquire of a key of another kind fails with a
// *WrongKindError (ErrWrongKind).
//
// The client behaves as every official client does (docs/protocol.md,
// "12. The official clients", and docs/client.md): one persistent
// connection per address (two for one address), entering the rotation only
// once its node answered an S; round-robin; pipelined requests matched by
// op and key in send order; liveness probes of silent connections;
// redials every 3 s; acquires moved to the next connection when theirs
// fails; M answers followed; releases and renewals retried every 200 ms
// for 5 s; at most 4096 acquires waiting per connection, more queued in the
// client. Every call ends in bounded time; ctx, the first argument of
// every call that can block, can end it sooner.
//
// It uses the standard library only. docs/go.md in the repository has the
// guide: install, examples, errors, timeouts, TLS.
package ringlock
