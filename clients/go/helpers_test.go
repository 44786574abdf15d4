package ringlock_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

// The real server, started by the tests on free loopback ports. Its path
// comes from RINGLOCK_BIN (the cargo test wrapper sets it); otherwise the
// newest of target/debug/ringlock and target/release/ringlock of the
// repository; otherwise cargo builds target/debug/ringlock.

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

func serverBinary() (string, error) {
	binOnce.Do(func() {
		if p := os.Getenv("RINGLOCK_BIN"); p != "" {
			binPath = p
			fmt.Fprintf(os.Stderr, "ringlock tests: server from RINGLOCK_BIN: %s\n", p)
			return
		}
		var best string
		var bestTime time.Time
		for _, profile := range []string{"debug", "release"} {
			p := filepath.Join(repoRoot(), "target", profile, "ringlock")
			if fi, err := os.Stat(p); err == nil && fi.ModTime().After(bestTime) {
				best, bestTime = p, fi.ModTime()
			}
		}
		if best != "" {
			binPath = best
			fmt.Fprintf(os.Stderr, "ringlock tests: server found at %s (set RINGLOCK_BIN for another)\n", best)
			return
		}
		fmt.Fprintf(os.Stderr, "ringlock tests: no server binary: building it with cargo build --bin ringlock\n")
		cmd := exec.Command("cargo", "build", "--bin", "ringlock")
		cmd.Dir = repoRoot()
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if binErr = cmd.Run(); binErr == nil {
			binPath = filepath.Join(repoRoot(), "target", "debug", "ringlock")
		}
	})
	return binPath, binErr
}

// node is one `ringlock serve` child process.
type node struct {
	args []string
	cmd  *exec.Cmd
	addr string
	mu   sync.Mutex
	log  []string
	done chan struct{}
}

// startNode starts `ringlock serve ARGS` and waits (at most 15 s) for its
// "listening on" line.
func startNode(tb testing.TB, args ...string) *node {
	tb.Helper()
	n, err := launch(args...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(n.kill)
	return n
}

func launch(args ...string) (*node, error) {
	bin, err := serverBinary()
	if err != nil {
		return nil, fmt.Errorf("no server binary: %v", err)
	}
	n := &node{args: args, done: make(chan struct{})}
	n.cmd = exec.Command(bin, append([]string{"serve"}, args...)...)
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := n.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := n.cmd.Start(); err != nil {
		return nil, err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			n.mu.Lock()
			n.log = append(n.log, line)
			n.mu.Unlock()
			if _, rest, ok := strings.Cut(line, "listening on "); ok {
				select {
				case found <- strings.Fields(rest)[0]:
				default:
				}
			}
		}
		_ = n.cmd.Wait()
		close(n.done)
	}()
	select {
	case n.addr = <-found:
		return n, nil
	case <-n.done:
	case <-time.After(15 * time.Second):
	}
	n.kill()
	return nil, fmt.Errorf("ringlock serve %v did not start:\n%s", args, n.logText())
}

func (n *node) logText() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return strings.Join(n.log, "\n")
}

func (n *node) running() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

func (n *node) signal(sig syscall.Signal) {
	if n.running() {
		_ = n.cmd.Process.Signal(sig)
	}
}

// kill sends SIGKILL and waits (bounded) for the process to end.
func (n *node) kill() {
	n.signal(syscall.SIGCONT)
	n.signal(syscall.SIGKILL)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
	}
}

// startSingle starts one node on a free port of 127.0.0.1.
func startSingle(tb testing.TB, extra ...string) *node {
	return startNode(tb, append([]string{"--listen", "127.0.0.1:0"}, extra...)...)
}

// loopbackIP is a loopback address of its own (127.x.y.z): ports picked on
// it cannot be taken by other tests' outgoing connections from 127.0.0.1.
func loopbackIP() string {
	return fmt.Sprintf("127.%d.%d.%d", 1+rand.Intn(254), rand.Intn(256), 1+rand.Intn(254))
}

func freePorts(tb testing.TB, ip string, n int) []string {
	tb.Helper()
	var ls []net.Listener
	var out []string
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			tb.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return out
}

// cluster is n nodes with the same --peers list, node 0 first.
type cluster struct {
	tb     testing.TB
	addrs  []string
	secret string
	nodes  []*node
}

func startCluster(tb testing.TB, n int) *cluster {
	tb.Helper()
	bin, err := serverBinary()
	if err != nil {
		tb.Fatal(err)
	}
	secret := filepath.Join(tb.TempDir(), "cluster.secret")
	if out, err := exec.Command(bin, "keygen", secret).CombinedOutput(); err != nil {
		tb.Fatalf("ringlock keygen: %v\n%s", err, out)
	}
	c := &cluster{tb: tb, addrs: freePorts(tb, loopbackIP(), n), secret: secret, nodes: make([]*node, n)}
	for i := range c.addrs {
		c.start(i)
	}
	c.waitSettled(0, nil, 15*time.Second)
	return c
}

func (c *cluster) start(i int) {
	c.nodes[i] = startNode(c.tb, "--listen", c.addrs[i], "--peers", strings.Join(c.addrs, ","),
		"--heartbeat-ms", "50", "--peer-timeout-ms", "500", "--cluster-secret-file", c.secret)
}

// waitSettled waits until node active is active and every node of alive
// (nil: all) names it.
func (c *cluster) waitSettled(active int, alive []int, within time.Duration) {
	c.tb.Helper()
	if alive == nil {
		for i := range c.addrs {
			alive = append(alive, i)
		}
	}
	until := time.Now().Add(within)
	for {
		ok := true
		for _, i := range alive {
			st, err := ringlock.QueryStatus(context.Background(), c.addrs[i], nil, 500*time.Millisecond)
			if err != nil || st.Active != c.addrs[active] || (st.Role == "active") != (i == active) {
				ok = false
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(until) {
			c.tb.Fatalf("the cluster did not settle on node %d within %v", active, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ctxFor is a context bounded by d, cancelled at the end of the test.
func ctxFor(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

func connect(tb testing.TB, addrs []string, opts *ringlock.Options) *ringlock.Client {
	tb.Helper()
	c, err := ringlock.Connect(ctxFor(tb, 10*time.Second), addrs, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// TestMain starts one node for the Example functions, which find it, as a
// program would, in RINGLOCK_SERVERS.
func TestMain(m *testing.M) {
	n, err := launch("--listen", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("RINGLOCK_SERVERS", n.addr)
	code := m.Run()
	n.kill()
	os.Exit(code)
}
