package ringlock_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// docBlock returns the fenced block of docs/go.md whose first line starts
// with first.
func docBlock(t *testing.T, first string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "go.md"))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(string(doc), "```")
	// Odd parts are inside fences: "lang\nbody".
	for i := 1; i < len(parts); i += 2 {
		_, body, _ := strings.Cut(parts[i], "\n")
		if strings.HasPrefix(body, first) {
			return body
		}
	}
	t.Fatalf("docs/go.md has no block starting with %q", first)
	return ""
}

func goTool() string {
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// newcomerEnv is the environment of someone who never set GOFLAGS or a
// workspace, without a module proxy (so nothing can be downloaded).
func newcomerEnv(servers string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "RINGLOCK_SERVERS=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GOPROXY=off", "GOTOOLCHAIN=local", "RINGLOCK_SERVERS="+servers)
}

// project lays out a checkout of this repository (a symbolic link) next
// to a new project directory holding go.mod and main.go.
func project(t *testing.T, gomod string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(repoRoot(), filepath.Join(dir, "ringlock")); err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(dir, "lockdemo")
	if err := os.Mkdir(app, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(app, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", gomod)
	write("main.go", docBlock(t, "// main.go"))
	return app
}

func runIn(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(3 * time.Minute):
			_ = cmd.Process.Kill()
		}
	}()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v in %s: %v\n%s", name, args, dir, err, out)
	}
	return string(out)
}

var firstProgramOutput = regexp.MustCompile(`^free at once, token \d+
step 1 under token (\d+)
step 2 under token \d+
step 3 under token \d+
released: true <nil>
$`)

func checkOutput(t *testing.T, out string) {
	t.Helper()
	if !firstProgramOutput.MatchString(out) {
		t.Fatalf("the program of docs/go.md printed:\n%s", out)
	}
}

// The program of docs/go.md's "A first program", with its go.mod (the
// replace directive), builds and runs as written in a fresh directory.
func TestDocsFirstProgramWithReplace(t *testing.T) {
	n := startSingle(t)
	gomod := docBlock(t, "module example.com/lockdemo")
	if !strings.Contains(gomod, "replace ringlock.dev/ringlock => ../ringlock/clients/go") {
		t.Fatalf("docs/go.md's go.mod has no replace directive:\n%s", gomod)
	}
	app := project(t, gomod)
	env := append(newcomerEnv(n.addr), "GOWORK=off")
	checkOutput(t, runIn(t, app, env, goTool(), "run", "."))
}

// The same program through a workspace, with the command docs/go.md gives.
func TestDocsFirstProgramWithWorkspace(t *testing.T) {
	n := startSingle(t)
	// The project's own go.mod: the module and go lines only.
	gomod := docBlock(t, "module example.com/lockdemo")
	own, _, _ := strings.Cut(gomod, "\nrequire")
	app := project(t, own+"\n")
	cmdline := docBlock(t, "go work init")
	env := append(newcomerEnv(n.addr), "PATH="+filepath.Dir(goTool())+string(os.PathListSeparator)+os.Getenv("PATH"))
	runIn(t, app, env, "sh", "-c", strings.TrimSpace(cmdline))
	checkOutput(t, runIn(t, app, env, goTool(), "run", "."))
}

// The Go blocks of docs/go.md's "Shared locks and semaphores" are code of
// the package's examples (example_test.go), which go test runs and checks
// against their output.
func TestDocsSharedBlocksAreExamples(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "go.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n### Shared locks and semaphores\n")
	if !ok {
		t.Fatal(`docs/go.md has no "Shared locks and semaphores"`)
	}
	section, _, _ = strings.Cut(section, "\n### ")
	blocks := 0
	for _, part := range strings.Split(section, "```go\n")[1:] {
		body, _, ok := strings.Cut(part, "```")
		if !ok {
			t.Fatal("an unclosed block")
		}
		blocks++
		// A block inside a list item is indented by two spaces.
		lines := strings.Split(strings.TrimRight(body, " \n"), "\n")
		indent := len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
		found := false
		for tabs := 1; tabs <= 4 && !found; tabs++ {
			var b strings.Builder
			for _, l := range lines {
				l = strings.TrimPrefix(l, strings.Repeat(" ", indent))
				if l != "" {
					b.WriteString(strings.Repeat("\t", tabs))
				}
				b.WriteString(l + "\n")
			}
			found = strings.Contains(string(src), b.String())
		}
		if !found {
			t.Errorf("this block of docs/go.md is not code of example_test.go:\n%s", body)
		}
	}
	if blocks != 3 {
		t.Fatalf("%d Go blocks in the section, want 3", blocks)
	}
}
