package ringlock

import (
	"errors"
	"strings"
)

// Sentinel errors. Every error a call returns matches exactly one of them
// with errors.Is (or a context error, when the call's context ended
// first); the error's text names the node and says what happened.
var (
	// ErrTimeout: Lock's wait ran out and nothing was granted (TryLock
	// reports a held lock as (nil, false, nil) instead).
	ErrTimeout = errors.New("ringlock: timed out waiting for the lock")
	// ErrConnection: no connection could carry the request, or a node did
	// not answer in time (refused, closed, silent under a liveness probe,
	// no answer within the wait plus the acquire grace). Trying again
	// later may work.
	ErrConnection = errors.New("ringlock: connection error")
	// ErrNoActiveNode: the nodes kept answering that no node is active
	// (M key -), or kept redirecting, for longer than the no-active
	// timeout (10 s by default).
	ErrNoActiveNode = errors.New("ringlock: no active node in the cluster")
	// ErrProtocol: a node sent E <reason>, a malformed or over-long line,
	// or an answer that matches no request; that connection is dropped.
	// For the official client this means a bug on one side, or a refusal
	// (a full lock table, too many waiting acquires).
	ErrProtocol = errors.New("ringlock: protocol error")
	// ErrNotAllowed: a node refused the request for this client's
	// identity (a server with access rules answers E with a reason that
	// says "not allowed"). Not retried: it would be refused again.
	ErrNotAllowed = errors.New("ringlock: not allowed")
	// ErrInvalidArgument: the call was refused before anything was sent
	// (a bad key, lease, wait or token; a TLS file that cannot be used).
	ErrInvalidArgument = errors.New("ringlock: invalid argument")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("ringlock: client closed")
	// ErrLockLost: a renewing lock is gone; the error is a *LostError.
	ErrLockLost = errors.New("ringlock: lock lost")
	// ErrWrongKind: an acquire was refused because the key is of another
	// kind (a semaphore, one of another limit, or a lock for a permit);
	// the error is a *WrongKindError. Nothing changed; not retried.
	ErrWrongKind = errors.New("ringlock: wrong kind")
)

// Error is the type of the errors the client returns: Kind is one of the
// sentinel errors (errors.Is matches it), Msg says what happened.
type Error struct {
	// Kind is ErrConnection, ErrProtocol, ... (see the sentinels).
	Kind error
	// Msg names the node and the cause.
	Msg string
}

// Error returns the kind's text and the message.
func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Kind.Error()
	}
	return e.Kind.Error() + ": " + e.Msg
}

// Unwrap returns the kind, for errors.Is.
func (e *Error) Unwrap() error { return e.Kind }

func newError(kind error, msg string) *Error { return &Error{Kind: kind, Msg: msg} }

// kindOf returns the sentinel kind of err, or nil.
func kindOf(err error) error {
	for _, k := range []error{ErrTimeout, ErrConnection, ErrNoActiveNode, ErrProtocol,
		ErrNotAllowed, ErrInvalidArgument, ErrClosed, ErrLockLost, ErrWrongKind} {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}

// refusalKind says which kind an E reason is: ErrNotAllowed for a refusal
// by access rules, ErrProtocol for anything else. Reasons are for people
// and their wording may change; this is the one distinction the client
// makes, so that a refusal is not retried like a broken connection.
func refusalKind(reason string) error {
	if strings.Contains(strings.ToLower(reason), "not allowed") {
		return ErrNotAllowed
	}
	return ErrProtocol
}

// LostError says why a RenewingLock was lost. errors.Is(err, ErrLockLost)
// is true for it.
type LostError struct {
	// Refused: a node answered that no grant of the key carries the token
	// (N key 0): its lease ran out, someone released it with the token, or
	// the grant did not survive a failover. False: no renewal was
	// confirmed before the lease could have run out (LastError says why),
	// or the client was closed.
	Refused bool
	// LastError is what went wrong with the last renewal attempt, if one
	// failed.
	LastError string
	// Closed: the client was closed while the lock was held, so nothing
	// renews it any more.
	Closed bool
}

// Error says why the lock was lost.
func (e *LostError) Error() string {
	switch {
	case e.Refused:
		return "ringlock: lock lost: the server no longer has the grant (its lease ran out, or it was released with the token)"
	case e.Closed:
		return "ringlock: lock lost: the client was closed, nothing renews the lock"
	case e.LastError != "":
		return "ringlock: lock lost: no renewal was confirmed before the lease ran out (last attempt: " + e.LastError + ")"
	}
	return "ringlock: lock lost: no renewal was confirmed before the lease ran out"
}

// Is makes errors.Is(err, ErrLockLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLockLost }
