// Command ringlock-go-bench measures acquire+release cycles per second of
// the Go client beside a stdlib-only Redis lock loop (SET key token NX PX,
// then a Lua compare-and-delete by EVALSHA, as redsync does) against a
// local redis-server, in the same run.
//
//	go run ./cmd/ringlock-go-bench [-duration 3s] [-rounds 3] [-workers 1,16]
//	    [-ringlock-bin ../../target/release/ringlock] [-redis-server redis-server]
//
// It starts one `ringlock serve` and one `redis-server --save ”
// --appendonly no` on free loopback ports, runs each scenario for
// -duration after a warm-up of a second (every loop bounded in time),
// prints a Markdown table and stops both servers. Each worker takes its own
// key (uncontended): it measures the clients' round trips, not lock
// contention. The ringlock workers share one Client (its pipelined
// connections, as a program would); each Redis worker has a connection of
// its own (as a pool gives).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"ringlock.dev/ringlock"
)

const releaseLua = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`

func main() {
	duration := flag.Duration("duration", 3*time.Second, "measured time of each scenario and round")
	rounds := flag.Int("rounds", 3, "rounds (the median is reported)")
	workersFlag := flag.String("workers", "1,16", "comma-separated worker counts")
	bin := flag.String("ringlock-bin", "../../target/release/ringlock", "the ringlock server binary")
	redisBin := flag.String("redis-server", "redis-server", "the redis-server binary")
	flag.Parse()
	var workers []int
	for _, w := range strings.Split(*workersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 1 || n > 1024 {
			fail(fmt.Errorf("bad -workers entry %q", w))
		}
		workers = append(workers, n)
	}
	rl, rlAddr, err := startRinglock(*bin)
	if err != nil {
		fail(err)
	}
	defer stop(rl)
	rd, rdAddr, err := startRedis(*redisBin)
	if err != nil {
		fail(err)
	}
	defer stop(rd)

	fmt.Printf("Go %s, %d CPUs, %s; ringlock at %s, Redis at %s; %v per round, median of %d rounds\n\n",
		runtime.Version(), runtime.NumCPU(), *bin, rlAddr, rdAddr, *duration, *rounds)
	fmt.Println("| workers | client | cycles/s | p50 µs | p99 µs |")
	fmt.Println("|---|---|---|---|---|")
	for _, w := range workers {
		for _, sys := range []string{"ringlock", "redis"} {
			var results []result
			for r := 0; r < *rounds; r++ {
				var res result
				var err error
				if sys == "ringlock" {
					res, err = benchRinglock(rlAddr, w, *duration)
				} else {
					res, err = benchRedis(rdAddr, w, *duration)
				}
				if err != nil {
					fail(fmt.Errorf("%s, %d workers: %w", sys, w, err))
				}
				results = append(results, res)
			}
			slices.SortFunc(results, func(a, b result) int { return int(a.rate - b.rate) })
			m := results[len(results)/2]
			name := "Go client"
			if sys == "redis" {
				name = "Redis SET NX PX + EVALSHA (stdlib loop)"
			}
			fmt.Printf("| %d | %s | %.1fk | %.1f | %.1f |\n", w, name, m.rate/1000, us(m.p50), us(m.p99))
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ringlock-go-bench:", err)
	os.Exit(1)
}

type result struct {
	rate     float64
	p50, p99 time.Duration
}

// run runs cycle in w workers for a warm-up second, then for d, and
// measures the cycles of d.
func run(w int, d time.Duration, cycle func(worker int, n int) error) (result, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now().Add(time.Second)
	end := start.Add(d)
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for n := 0; ; n++ {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				if err := cycle(i, n); err != nil {
					mu.Lock()
					firstErr = errors.Join(firstErr, err)
					mu.Unlock()
					return
				}
				if t0.After(start) {
					mine = append(mine, time.Since(t0))
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return result{}, firstErr
	}
	if len(lat) == 0 {
		return result{}, errors.New("no cycle measured")
	}
	slices.Sort(lat)
	return result{
		rate: float64(len(lat)) / d.Seconds(),
		p50:  lat[len(lat)/2],
		p99:  lat[len(lat)*99/100],
	}, nil
}

func benchRinglock(addr string, w int, d time.Duration) (result, error) {
	ctx := context.Background()
	c, err := ringlock.Connect(ctx, []string{addr}, nil)
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	return run(w, d, func(worker, _ int) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		key := "bench/" + strconv.Itoa(worker)
		l, err := c.Lock(cctx, key, 30*time.Second, 5*time.Second)
		if err != nil {
			return err
		}
		ok, err := l.Release(cctx)
		if err == nil && !ok {
			err = errors.New("release found no grant")
		}
		return err
	})
}

// redisConn is a minimal RESP client: one request, one reply, in turn.
type redisConn struct {
	nc net.Conn
	rd *bufio.Reader
}

func (r *redisConn) do(args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_ = r.nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.nc.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := r.rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "-"):
		return "", errors.New("redis: " + line[1:])
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err // a nil bulk string: "" and no error
		}
		buf := make([]byte, n+2)
		if _, err := io_ReadFull(r.rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line, nil // +OK, :1
}

func io_ReadFull(rd *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := rd.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func benchRedis(addr string, w int, d time.Duration) (result, error) {
	conns := make([]*redisConn, w)
	for i := range conns {
		nc, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			return result{}, err
		}
		defer nc.Close()
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		conns[i] = &redisConn{nc: nc, rd: bufio.NewReader(nc)}
	}
	sha, err := conns[0].do("SCRIPT", "LOAD", releaseLua)
	if err != nil {
		return result{}, err
	}
	return run(w, d, func(worker, n int) error {
		c := conns[worker]
		key := "bench/" + strconv.Itoa(worker)
		token := strconv.Itoa(worker) + "-" + strconv.Itoa(n)
		got, err := c.do("SET", key, token, "NX", "PX", "30000")
		if err != nil {
			return err
		}
		if got != "+OK" {
			return fmt.Errorf("SET NX answered %q", got)
		}
		got, err = c.do("EVALSHA", sha, "1", key, token)
		if err != nil {
			return err
		}
		if got != ":1" {
			return fmt.Errorf("release answered %q", got)
		}
		return nil
	})
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func startRinglock(bin string) (*exec.Cmd, string, error) {
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if _, rest, ok := strings.Cut(sc.Text(), "listening on "); ok {
				select {
				case found <- strings.Fields(rest)[0]:
				default:
				}
			}
		}
	}()
	select {
	case addr := <-found:
		return cmd, addr, nil
	case <-time.After(15 * time.Second):
		stop(cmd)
		return nil, "", errors.New("ringlock serve did not start within 15s")
	}
}

func startRedis(bin string) (*exec.Cmd, string, error) {
	addr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	until := time.Now().Add(15 * time.Second)
	for time.Now().Before(until) {
		if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = nc.Close()
			return cmd, addr, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop(cmd)
	return nil, "", errors.New("redis-server did not start within 15s")
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
	}
}
