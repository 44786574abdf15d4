package ringlock

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxPermits is the most permits a semaphore key may have (the limit of a
// semaphore acquire, C in the protocol).
const MaxPermits = 65536

// Kind is how an acquire holds its key: alone (Exclusive, what Lock asks
// for), beside other shared holders (Shared, a read lock), or as one of at
// most N permits (Permits(N), a counting semaphore). Whatever its kind,
// every grant has its own fencing token and lease, and is released,
// renewed and watched as an exclusive lock is (docs/shared.md).
//
// A key acquired both Exclusive and Shared is a read/write lock, strictly
// first come, first served: consecutive shared acquires at the head of the
// queue are granted together, and a shared acquire that arrives while an
// exclusive one waits waits behind it (writers are not starved). There is
// no upgrade: a shared holder that wants the key alone releases its grant,
// then acquires Exclusive. The zero Kind is Exclusive.
type Kind struct {
	op    op
	limit int
}

var (
	// Exclusive holds the key alone (A): what Lock, TryLock and Acquire
	// ask for.
	Exclusive = Kind{}
	// Shared holds the key beside other shared holders, never beside an
	// exclusive one (G): a read lock.
	Shared = Kind{op: opShared}
)

// Permits is one of at most n permits of the key (C): a counting
// semaphore, n from 1 to MaxPermits. Every acquirer of the key asks with
// the same n: the first one to find the key with no holders and no
// waiters fixes it, and one with another n is refused (a *WrongKindError)
// while the key has holders. An n out of range is refused with
// ErrInvalidArgument when the Kind is used, before anything is sent.
func Permits(n int) Kind { return Kind{op: opPermit, limit: n} }

// IsShared says whether k is Shared.
func (k Kind) IsShared() bool { return k.op == opShared }

// Limit returns n of Permits(n), 0 for Exclusive and Shared.
func (k Kind) Limit() int {
	if k.op != opPermit {
		return 0
	}
	return k.limit
}

// String is "exclusive", "shared" or "permits(N)".
func (k Kind) String() string {
	switch k.op {
	case opShared:
		return "shared"
	case opPermit:
		return "permits(" + strconv.Itoa(k.limit) + ")"
	}
	return "exclusive"
}

// reqOp is the op of k's acquire request (and of its answers, but for M).
func (k Kind) reqOp() op {
	if k.op == 0 {
		return opAcquire
	}
	return k.op
}

// check refuses a Kind the protocol cannot send.
func (k Kind) check() error {
	switch k.op {
	case 0, opShared:
		return nil
	case opPermit:
		if k.limit < 1 || k.limit > MaxPermits {
			return newError(ErrInvalidArgument, fmt.Sprintf("a semaphore has 1 to %d permits, not %d", MaxPermits, k.limit))
		}
		return nil
	}
	return newError(ErrInvalidArgument, "unknown kind")
}

// WrongKindError says that an acquire was refused because the key is of
// another kind right now: a semaphore (of another limit) for a shared
// acquire or a permit, a lock (held or waited for, exclusive or shared)
// for a permit, a semaphore for an exclusive acquire. Nothing changed on
// the node, and the acquire is not retried: it would be refused again
// while the key has holders or waiters of that kind.
// errors.Is(err, ErrWrongKind) is true for it.
type WrongKindError struct {
	// Key is the key asked for.
	Key string
	// Asked is the kind asked for.
	Asked Kind
	// Limit is the live semaphore's number of permits when the key is a
	// semaphore; 0 when it is a lock.
	Limit int
	// Addr is the node that refused.
	Addr string
	// Reason is the node's own words when it refused an exclusive acquire
	// of a semaphore (an E line, which also closed that connection).
	Reason string
}

// Error says what the key is.
func (e *WrongKindError) Error() string {
	asked := "an exclusive acquire"
	switch e.Asked.op {
	case opShared:
		asked = "a shared acquire"
	case opPermit:
		asked = fmt.Sprintf("a permit (of %d)", e.Asked.limit)
	}
	is := "it is held or waited for as a lock"
	if e.Limit > 0 {
		is = fmt.Sprintf("it is a semaphore of %d permits", e.Limit)
	}
	return fmt.Sprintf("ringlock: wrong kind: %s of %q refused by %s: %s", asked, e.Key, e.Addr, is)
}

// Is makes errors.Is(err, ErrWrongKind) true.
func (e *WrongKindError) Is(target error) bool { return target == ErrWrongKind }

// semaphoreRefusal reads an E reason that refuses an exclusive acquire of
// a live semaphore: `key "X" is a semaphore of N permits: acquire it with
// C in line L`. It returns the quoted key as the node wrote it and N; ok
// is false for any other reason. The words are this server's (see
// docs/protocol.md, section 8); N must be a limit of the protocol.
func semaphoreRefusal(reason string) (quoted string, limit int, ok bool) {
	rest, found := strings.CutPrefix(reason, `key "`)
	if !found {
		return "", 0, false
	}
	quoted, rest, found = strings.Cut(rest, `" is a semaphore of `)
	if !found {
		return "", 0, false
	}
	digits, _, found := strings.Cut(rest, " permits: acquire it with C")
	if !found || len(digits) == 0 || len(digits) > 5 {
		return "", 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 || n > MaxPermits || digits[0] == '+' || digits[0] == '-' {
		return "", 0, false
	}
	return quoted, n, true
}

// quoteKey writes key as the node quotes bytes in its E reasons: printable
// ASCII but `"` and `\` as is, anything else as \xNN (lower-case hex),
// cut after 40 bytes with "...".
func quoteKey(key string) string {
	const limit = 40
	var b strings.Builder
	for i := 0; i < len(key) && i < limit; i++ {
		c := key[i]
		if c >= 0x20 && c <= 0x7e && c != '"' && c != '\\' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	if len(key) > limit {
		b.WriteString("...")
	}
	return b.String()
}
