// Command ringlock-conformance-adapter drives the Go client for the
// conformance suite (clients/conformance): JSON lines on stdin, one command
// each, replies and events on stdout, as clients/conformance/ADAPTER.md
// says. Each command runs as soon as it is read, concurrently with the
// others; each reply is written whole, in the order the calls finish.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"ringlock.dev/ringlock"
)

// command is one line of input; fields a command does not use stay zero.
type command struct {
	ID      int64             `json:"id"`
	Cmd     string            `json:"cmd"`
	Addrs   []string          `json:"addrs"`
	Options map[string]*int64 `json:"options"`
	TLS     *struct {
		CAFile     string `json:"ca_file"`
		CertFile   string `json:"cert_file"`
		KeyFile    string `json:"key_file"`
		ServerName string `json:"server_name"`
	} `json:"tls"`
	Key     string `json:"key"`
	LeaseMs int64  `json:"lease_ms"`
	WaitMs  *int64 `json:"wait_ms"`
	Token   string `json:"token"`
	Lock    int64  `json:"lock"`
}

type adapter struct {
	out *json.Encoder
	wmu sync.Mutex

	mu     sync.Mutex
	client *ringlock.Client
	closed bool
	locks  map[int64]*ringlock.RenewingLock
	wg     sync.WaitGroup
}

func (a *adapter) write(v map[string]any) {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	_ = a.out.Encode(v) // one whole line each
}

func reply(id int64, fields map[string]any) map[string]any {
	out := map[string]any{"id": id, "ok": true}
	for k, v := range fields {
		out[k] = v
	}
	return out
}

func failure(id int64, kind, msg string) map[string]any {
	return map[string]any{"id": id, "ok": false, "error": kind, "message": msg}
}

// kind is the adapter protocol's name for what the library reported.
func kind(err error) string {
	switch {
	case errors.Is(err, ringlock.ErrConnection):
		return "connection"
	case errors.Is(err, ringlock.ErrNoActiveNode):
		return "no_active"
	case errors.Is(err, ringlock.ErrNotAllowed):
		return "not_allowed"
	case errors.Is(err, ringlock.ErrProtocol):
		return "protocol"
	case errors.Is(err, ringlock.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, ringlock.ErrTimeout):
		return "timeout"
	case errors.Is(err, ringlock.ErrClosed):
		return "closed"
	}
	return "other"
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

func (a *adapter) run(c command) map[string]any {
	if c.Cmd == "connect" {
		return a.connect(c)
	}
	a.mu.Lock()
	client, closed := a.client, a.closed
	a.mu.Unlock()
	known := map[string]bool{"acquire": true, "try_acquire": true, "release": true, "renew": true,
		"lock_renewing": true, "unlock": true, "status": true, "stats": true, "close": true}
	if !known[c.Cmd] {
		return failure(c.ID, "unsupported", fmt.Sprintf("unknown command %q", c.Cmd))
	}
	if client == nil || closed {
		return failure(c.ID, "closed", "no client: connect first, or it was closed")
	}
	ctx := context.Background()
	wait := time.Duration(0)
	if c.WaitMs != nil {
		wait = ms(*c.WaitMs)
	}
	switch c.Cmd {
	case "acquire", "try_acquire":
		var l *ringlock.Lock
		var ok bool
		var err error
		if c.Cmd == "acquire" {
			l, ok, err = client.Acquire(ctx, c.Key, ms(c.LeaseMs), wait)
		} else {
			l, ok, err = client.TryLock(ctx, c.Key, ms(c.LeaseMs))
		}
		if err != nil {
			return failure(c.ID, kind(err), err.Error())
		}
		if !ok {
			return reply(c.ID, map[string]any{"granted": false})
		}
		return reply(c.ID, map[string]any{"granted": true, "token": strconv.FormatUint(l.Token(), 10)})
	case "release", "renew":
		token, perr := strconv.ParseUint(c.Token, 10, 64)
		if perr != nil {
			return failure(c.ID, "invalid_argument", "token: "+perr.Error())
		}
		if c.Cmd == "release" {
			ok, err := client.Release(ctx, c.Key, token)
			if err != nil {
				return failure(c.ID, kind(err), err.Error())
			}
			return reply(c.ID, map[string]any{"released": ok})
		}
		ok, err := client.Renew(ctx, c.Key, token, ms(c.LeaseMs))
		if err != nil {
			return failure(c.ID, kind(err), err.Error())
		}
		return reply(c.ID, map[string]any{"renewed": ok})
	case "lock_renewing":
		return a.lockRenewing(ctx, client, c, wait)
	case "unlock":
		a.mu.Lock()
		l := a.locks[c.Lock]
		delete(a.locks, c.Lock)
		a.mu.Unlock()
		if l == nil {
			return failure(c.ID, "other", fmt.Sprintf("no lock %d", c.Lock))
		}
		ok, err := l.Release(ctx)
		if err != nil {
			return failure(c.ID, kind(err), err.Error())
		}
		return reply(c.ID, map[string]any{"released": ok})
	case "status":
		var nodes []map[string]any
		for _, st := range client.Status(ctx) {
			if st.Err != nil {
				nodes = append(nodes, map[string]any{"addr": st.Addr, "ok": false, "error": kind(st.Err), "message": st.Err.Error()})
				continue
			}
			active := st.Status.Active
			if active == "" {
				active = "-"
			}
			nodes = append(nodes, map[string]any{"addr": st.Addr, "ok": true, "role": st.Status.Role,
				"active": active, "token": strconv.FormatUint(st.Status.Token, 10)})
		}
		return reply(c.ID, map[string]any{"nodes": nodes})
	case "stats":
		return reply(c.ID, map[string]any{"connected": client.Connected(), "connections": client.Connections()})
	default: // close
		a.close()
		return reply(c.ID, nil)
	}
}

func (a *adapter) connect(c command) map[string]any {
	opts := &ringlock.Options{}
	get := func(name string) time.Duration {
		if v := c.Options[name]; v != nil {
			return ms(*v)
		}
		return 0
	}
	opts.ConnectTimeout = get("connect_timeout_ms")
	opts.ProbeInterval = get("probe_interval_ms")
	opts.ProbeTimeout = get("probe_timeout_ms")
	opts.AcquireGrace = get("acquire_grace_ms")
	opts.RequestTimeout = get("request_timeout_ms")
	opts.RetryEvery = get("retry_every_ms")
	opts.RetryFor = get("retry_for_ms")
	opts.RedialInterval = get("redial_interval_ms")
	opts.NoActiveTimeout = get("no_active_timeout_ms")
	if c.TLS != nil {
		conf, err := ringlock.LoadTLS(c.TLS.CAFile, c.TLS.CertFile, c.TLS.KeyFile, c.TLS.ServerName)
		if err != nil {
			return failure(c.ID, kind(err), err.Error())
		}
		opts.TLS = conf
	}
	client, err := ringlock.Connect(context.Background(), c.Addrs, opts)
	if err != nil {
		return failure(c.ID, kind(err), err.Error())
	}
	a.mu.Lock()
	old := a.client
	a.client, a.closed = client, false
	a.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return reply(c.ID, nil)
}

func (a *adapter) lockRenewing(ctx context.Context, client *ringlock.Client, c command, wait time.Duration) map[string]any {
	l, err := client.LockRenewing(ctx, c.Key, ms(c.LeaseMs), wait)
	if errors.Is(err, ringlock.ErrTimeout) {
		return reply(c.ID, map[string]any{"granted": false})
	}
	if err != nil {
		return failure(c.ID, kind(err), err.Error())
	}
	a.mu.Lock()
	a.locks[c.ID] = l
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		<-l.Done()
		err := l.Err()
		var lost *ringlock.LostError
		if !errors.As(err, &lost) {
			return // released without a loss
		}
		reason := "expired"
		switch {
		case lost.Refused:
			reason = "refused"
		case lost.Closed:
			reason = "other"
		}
		a.write(map[string]any{"event": "lost", "lock": c.ID, "reason": reason, "message": err.Error()})
	}()
	return reply(c.ID, map[string]any{"granted": true, "token": strconv.FormatUint(l.Token(), 10), "lock": c.ID})
}

func (a *adapter) close() {
	a.mu.Lock()
	client := a.client
	a.closed = true
	a.mu.Unlock()
	if client != nil {
		_ = client.Close() // bounded: about 2 s at most
	}
}

func main() {
	a := &adapter{out: json.NewEncoder(os.Stdout), locks: map[int64]*ringlock.RenewingLock{}}
	in := bufio.NewReaderSize(os.Stdin, 64*1024)
	var calls sync.WaitGroup
	for {
		line, err := in.ReadBytes('\n')
		if len(line) > 0 {
			var c command
			if jerr := json.Unmarshal(line, &c); jerr != nil {
				var id struct {
					ID int64 `json:"id"`
				}
				_ = json.Unmarshal(line, &id)
				a.write(failure(id.ID, "unsupported", "cannot parse the command: "+jerr.Error()))
			} else {
				calls.Add(1)
				go func() {
					defer calls.Done()
					a.write(a.run(c))
				}()
			}
		}
		if err != nil {
			break
		}
	}
	// End of input: close the client (bounded) and exit 0. Calls still
	// running end with the client's errors.
	done := make(chan struct{})
	go func() { a.close(); calls.Wait(); a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	fmt.Fprintln(os.Stderr, "ringlock-conformance-adapter (Go): end of input, closed")
}
