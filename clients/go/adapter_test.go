package ringlock_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The conformance adapter speaks clients/conformance/ADAPTER.md: a short
// session against the real server (the conformance runner checks it in
// depth, against its fake nodes).
func TestConformanceAdapter(t *testing.T) {
	n := startSingle(t)
	bin := filepath.Join(t.TempDir(), "adapter")
	if out, err := exec.Command(goTool(), "build", "-o", bin, "./cmd/ringlock-conformance-adapter").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan map[string]any, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("adapter wrote %q: %v", sc.Text(), err)
			}
			lines <- m
		}
		close(lines)
	}()
	next := func() map[string]any {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatal("the adapter's output ended")
			}
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no line from the adapter within 10s")
		}
		return nil
	}
	send := func(s string) map[string]any {
		if _, err := io.WriteString(stdin, s+"\n"); err != nil {
			t.Fatal(err)
		}
		return next()
	}
	expect := func(got map[string]any, want string) {
		t.Helper()
		for _, kv := range strings.Split(want, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if fmt.Sprint(got[k]) != v {
				t.Fatalf("reply %v: %s is %v, want %s", got, k, got[k], v)
			}
		}
	}
	expect(send(`{"id":1,"cmd":"acquire","key":"k","lease_ms":1000}`), "id=1,ok=false,error=closed")
	expect(send(fmt.Sprintf(`{"id":2,"cmd":"connect","addrs":[%q],"options":{"probe_interval_ms":500}}`, n.addr)), "id=2,ok=true")
	got := send(`{"id":3,"cmd":"acquire","key":"k","lease_ms":5000,"wait_ms":1000}`)
	expect(got, "id=3,ok=true,granted=true")
	token := got["token"].(string)
	expect(send(`{"id":4,"cmd":"try_acquire","key":"k","lease_ms":5000}`), "id=4,ok=true,granted=false")
	expect(send(fmt.Sprintf(`{"id":5,"cmd":"renew","key":"k","token":%q,"lease_ms":5000}`, token)), "ok=true,renewed=true")
	expect(send(fmt.Sprintf(`{"id":6,"cmd":"release","key":"k","token":%q}`, token)), "ok=true,released=true")
	expect(send(`{"id":7,"cmd":"acquire","key":"bad key","lease_ms":5000}`), "ok=false,error=invalid_argument")
	expect(send(`{"id":8,"cmd":"lock_renewing","key":"r","lease_ms":3000,"wait_ms":1000}`), "id=8,ok=true,granted=true,lock=8")
	expect(send(`{"id":9,"cmd":"unlock","lock":8}`), "id=9,ok=true,released=true")
	got = send(`{"id":10,"cmd":"status"}`)
	nodes := got["nodes"].([]any)
	expect(nodes[0].(map[string]any), "ok=true,role=active")
	expect(send(`{"id":11,"cmd":"stats"}`), "connected=2,connections=2")
	expect(send(`{"id":12,"cmd":"fly"}`), "id=12,ok=false,error=unsupported")
	expect(send(`not json`), "id=0,ok=false,error=unsupported")
	// A renewing lock released by its token elsewhere: the lost event.
	got = send(`{"id":13,"cmd":"lock_renewing","key":"q","lease_ms":600}`)
	expect(got, "ok=true,granted=true")
	// The reply and the event may come in either order: the renewal that
	// finds the grant gone can be answered right behind the release.
	first := send(fmt.Sprintf(`{"id":14,"cmd":"release","key":"q","token":%q}`, got["token"]))
	second := next()
	if first["event"] != nil {
		first, second = second, first
	}
	expect(first, "id=14,ok=true,released=true")
	expect(second, "event=lost,lock=13,reason=refused")
	expect(send(`{"id":15,"cmd":"close"}`), "id=15,ok=true")
	expect(send(`{"id":16,"cmd":"stats"}`), "ok=false,error=closed")
	_ = stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("adapter exit: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the adapter did not exit within 3s of the end of its input")
	}
}
