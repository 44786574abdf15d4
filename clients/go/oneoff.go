package ringlock

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// oneOff sends one request line to addr on a connection of its own and
// returns a reader of its answers and the function that closes it, with
// the whole exchange bounded by timeout and ctx.
func oneOff(ctx context.Context, addr string, conf *tls.Config, request []byte, max int, timeout time.Duration) (func(), *bufio.Reader, error) {
	timeout = setting(timeout, DefaultConnectTimeout)
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	nc, err := dialAddr(ctx, addr, conf, time.Until(deadline), ctx.Done())
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("ringlock: %s: %w", addr, ctx.Err())
		}
		return nil, nil, newError(ErrConnection, err.Error())
	}
	_ = nc.SetDeadline(deadline)
	// A ctx that ends interrupts the exchange at once.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	done := func() {
		stop()
		_ = nc.Close()
	}
	if _, err := nc.Write(request); err != nil {
		done()
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("ringlock: %s: %w", addr, ctx.Err())
		}
		return nil, nil, newError(ErrConnection, fmt.Sprintf("write to %s: %s", addr, explain(err)))
	}
	return done, bufio.NewReaderSize(nc, max), nil
}

// readAnswer reads one answer line of at most the reader's size.
func readAnswer(ctx context.Context, rd *bufio.Reader, addr string, timeout time.Duration) ([]byte, error) {
	line, err := rd.ReadSlice('\n')
	if err != nil {
		var ne net.Error
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("ringlock: %s: %w", addr, ctx.Err())
		case errors.Is(err, bufio.ErrBufferFull):
			return nil, newError(ErrProtocol, fmt.Sprintf("answer line from %s longer than %d bytes", addr, rd.Size()))
		case errors.As(err, &ne) && ne.Timeout():
			return nil, newError(ErrConnection, fmt.Sprintf("%s: no answer within %v", addr, setting(timeout, DefaultConnectTimeout)))
		case errors.Is(err, io.EOF):
			return nil, newError(ErrConnection, addr+" closed the connection")
		}
		return nil, newError(ErrConnection, fmt.Sprintf("read from %s: %s", addr, explain(err)))
	}
	return line[:len(line)-1], nil
}

// QueryStatus asks one node for its status (S) on a connection of its own,
// within timeout (0: the default connect timeout, 3 s) and ctx. conf, if
// not nil, makes it TLS (see LoadTLS).
func QueryStatus(ctx context.Context, addr string, conf *tls.Config, timeout time.Duration) (NodeStatus, error) {
	if conf != nil {
		var err error
		if conf, err = checkTLS(conf); err != nil {
			return NodeStatus{}, err
		}
	}
	return statusVia(ctx, addr, conf, timeout)
}

func statusVia(ctx context.Context, addr string, conf *tls.Config, timeout time.Duration) (NodeStatus, error) {
	done, rd, err := oneOff(ctx, addr, conf, []byte("S\n"), maxAnswerLine, timeout)
	if err != nil {
		return NodeStatus{}, err
	}
	defer done()
	line, err := readAnswer(ctx, rd, addr, timeout)
	if err != nil {
		return NodeStatus{}, err
	}
	a, perr := parseAnswer(line)
	switch {
	case perr != nil:
		return NodeStatus{}, newError(ErrProtocol, fmt.Sprintf("%s: %v", addr, perr))
	case a.op == 'S':
		return NodeStatus{Role: a.role, Active: a.addr, Token: a.token}, nil
	case a.op == 'E':
		return NodeStatus{}, newError(refusalKind(a.text), fmt.Sprintf("%s says: E %s", addr, a.text))
	}
	return NodeStatus{}, newError(ErrProtocol, fmt.Sprintf("%s answered S with %q", addr, clip(line)))
}

// QueryProblem asks one node whether it knows of a problem in its
// cluster's configuration (H), on a connection of its own, within timeout
// (0: 3 s) and ctx. It returns "" when the node knows of none (a node too
// old to know H counts as knowing none); the text is for people.
func QueryProblem(ctx context.Context, addr string, conf *tls.Config, timeout time.Duration) (string, error) {
	if conf != nil {
		var err error
		if conf, err = checkTLS(conf); err != nil {
			return "", err
		}
	}
	done, rd, err := oneOff(ctx, addr, conf, []byte("H\n"), maxHealthLine, timeout)
	if err != nil {
		return "", err
	}
	defer done()
	line, err := readAnswer(ctx, rd, addr, timeout)
	if err != nil {
		return "", err
	}
	a, perr := parseAnswer(line)
	switch {
	case perr == nil && a.op == 'H':
		return a.text, nil
	case perr == nil && a.op == 'E':
		return "", nil
	}
	return "", newError(ErrProtocol, fmt.Sprintf("%s answered H with %q", addr, clip(line)))
}

// LockInfo is one lock of a node's table, as L lists it.
type LockInfo struct {
	// Key of the lock.
	Key string
	// Token of its holder; 0 when nobody holds it (only a held-back T
	// keeps it in the table).
	Token uint64
	// LeaseLeft of the holder (0 without a holder).
	LeaseLeft time.Duration
	// Waiters: acquires waiting for it on that node (at most 65536).
	Waiters uint64
}

// ListLocks asks one node for one page of its lock table (L cursor limit
// [prefix], an operator's request), on a connection of its own, within
// timeout (0: 3 s) and ctx. cursor is 0 for the first page, else the
// cursor the previous page returned; limit is 1 to 1000; prefix "" lists
// every key. It returns the locks and the cursor of the next page (0: the
// listing is complete). A node too old to know L answers E: ErrProtocol.
func ListLocks(ctx context.Context, addr string, conf *tls.Config, prefix string, cursor uint64, limit int, timeout time.Duration) ([]LockInfo, uint64, error) {
	if limit < 1 || limit > 1000 {
		return nil, 0, newError(ErrInvalidArgument, fmt.Sprintf("limit %d (1 to 1000)", limit))
	}
	if prefix != "" {
		if err := checkKey(prefix); err != nil {
			return nil, 0, newError(ErrInvalidArgument, "prefix: "+err.(*Error).Msg)
		}
	}
	if conf != nil {
		var err error
		if conf, err = checkTLS(conf); err != nil {
			return nil, 0, err
		}
	}
	done, rd, err := oneOff(ctx, addr, conf, listLine(cursor, limit, prefix), maxAnswerLine, timeout)
	if err != nil {
		return nil, 0, err
	}
	defer done()
	var locks []LockInfo
	for {
		line, err := readAnswer(ctx, rd, addr, timeout)
		if err != nil {
			return nil, 0, err
		}
		a, perr := parseAnswer(line)
		switch {
		case perr == nil && a.op == 'K' && len(locks) < limit:
			locks = append(locks, LockInfo{Key: a.key, Token: a.token,
				LeaseLeft: time.Duration(min(a.lease, 1<<40)) * time.Millisecond,
				Waiters:   a.waits})
		case perr == nil && a.op == 'L':
			if a.token != 0 && a.token <= cursor {
				return nil, 0, newError(ErrProtocol, fmt.Sprintf("%s: the L cursor did not grow (%d after %d)", addr, a.token, cursor))
			}
			return locks, a.token, nil
		case perr == nil && a.op == 'E':
			return nil, 0, newError(refusalKind(a.text), fmt.Sprintf("%s says: E %s", addr, a.text))
		default:
			return nil, 0, newError(ErrProtocol, fmt.Sprintf("%s answered L with %q", addr, clip(line)))
		}
	}
}

// ListLocks is the package's ListLocks with the client's TLS settings and
// connect timeout.
func (c *Client) ListLocks(ctx context.Context, addr, prefix string, cursor uint64, limit int) ([]LockInfo, uint64, error) {
	return ListLocks(ctx, addr, c.opts.tls, prefix, cursor, limit, c.opts.connectTimeout)
}
