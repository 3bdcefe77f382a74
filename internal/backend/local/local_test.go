package local_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/local"
	"agentbox/internal/gitx"
)

// requireBwrap fails (never skips) a test on a machine without bubblewrap:
// the sandbox is the point of this backend.
func requireBwrap(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bubblewrap (bwrap) is not installed: install it (apt-get install bubblewrap) to test the local backend")
	}
}

var (
	clientOnce sync.Once
	clientPath string
	clientErr  error
)

// testClient builds testdata/sockclient, a static stand-in for the
// jailbee client, once per test binary.
func testClient(t *testing.T) string {
	t.Helper()
	clientOnce.Do(func() {
		dir, err := os.MkdirTemp("", "local-test-client-")
		if err != nil {
			clientErr = err
			return
		}
		clientPath = filepath.Join(dir, "sockclient")
		cmd := exec.Command("go", "build", "-o", clientPath, "./testdata/sockclient")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			clientErr = errors.New("go build sockclient: " + err.Error() + "\n" + string(out))
		}
	})
	if clientErr != nil {
		t.Fatal(clientErr)
	}
	return clientPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if clientPath != "" {
		os.RemoveAll(filepath.Dir(clientPath))
	}
	os.Exit(code)
}

func newBackend(t *testing.T, opts local.Options) *local.Backend {
	t.Helper()
	if !opts.Insecure {
		requireBwrap(t)
	}
	if opts.Root == "" {
		opts.Root = filepath.Join(t.TempDir(), "sandboxes")
	}
	b, err := local.New(opts)
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	return b
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newBackend(t, local.Options{ClientBinary: testClient(t)})
	}, backendtest.Options{})
}

func TestConformanceInsecure(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newBackend(t, local.Options{Insecure: true, ClientBinary: testClient(t)})
	}, backendtest.Options{HostUser: true})
}

func TestTypeAndNew(t *testing.T) {
	b := newBackend(t, local.Options{})
	if b.Type() != local.Type || local.Type != "local" {
		t.Fatalf("Type() = %q", b.Type())
	}
	if _, err := local.New(local.Options{}); err == nil {
		t.Fatal("New without a root succeeded")
	}
	if _, err := local.New(local.Options{Root: t.TempDir(), ClientBinary: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Fatal("New with a missing client binary succeeded")
	}
}

func TestNewWithoutBwrap(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := local.New(local.Options{Root: t.TempDir()})
	if err == nil {
		t.Fatal("New without bwrap on PATH succeeded")
	}
	for _, want := range []string{"install bubblewrap", "--insecure-no-sandbox"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := local.New(local.Options{Root: t.TempDir(), Insecure: true}); err != nil {
		t.Fatalf("insecure New without bwrap: %v", err)
	}
}

// started makes a running sandbox with the test client bound as jailbee.
func started(t *testing.T, opts local.Options) (*local.Backend, string, backendtest.Repo) {
	t.Helper()
	if opts.ClientBinary == "" {
		opts.ClientBinary = testClient(t)
	}
	b := newBackend(t, opts)
	repo := backendtest.NewRepo(t)
	return b, backendtest.CreateStarted(t, b, "x", repo), repo
}

func sh(t *testing.T, b backend.Backend, name, user, script string) backendtest.Result {
	t.Helper()
	return backendtest.Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", script}, User: user})
}

func TestRunsAsAgentUser(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	r := sh(t, b, name, "", `id -un; id -u; id -g; echo "$HOME|$USER|$PWD"`)
	want := "agent\n1000\n1000\n/home/agent|agent|/workspace\n"
	if r.Stdout != want {
		t.Fatalf("got %q, want %q", r.Stdout, want)
	}
}

func TestRootInsideHasNoCapabilities(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	r := sh(t, b, name, "root", `id -u; grep CapEff /proc/self/status`)
	if !strings.HasPrefix(r.Stdout, "0\n") || !strings.Contains(r.Stdout, "CapEff:\t0000000000000000") {
		t.Fatalf("root inside: %q, want uid 0 and no effective capabilities", r.Stdout)
	}
	if r := sh(t, b, name, "root", "mount -t tmpfs none /mnt"); r.Code == 0 {
		t.Fatal("root inside could mount")
	}
}

func TestSystemIsReadOnly(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	probe := "/usr/agentbox-write-probe-" + randomHex(t)
	for _, user := range []string{"", "root"} {
		if r := sh(t, b, name, user, "touch "+probe); r.Code == 0 {
			t.Errorf("user %q wrote %s", user, probe)
		}
		if r := sh(t, b, name, user, "touch /etc/passwd"); r.Code == 0 {
			t.Errorf("user %q wrote /etc/passwd", user)
		}
		if r := sh(t, b, name, user, "mkdir /newdir"); r.Code == 0 {
			t.Errorf("user %q made a directory at the sandbox root", user)
		}
	}
	if _, err := os.Stat(probe); err == nil {
		os.Remove(probe)
		t.Fatal("the probe reached the host's /usr")
	}
	// The tools still run: the system is there, only read-only.
	if r := sh(t, b, name, "", "ls /usr/bin >/dev/null && test -d /bin"); r.Code != 0 {
		t.Fatalf("system dirs not usable: %+v", r)
	}
}

func TestHostEtcIsHidden(t *testing.T) {
	if _, err := os.Stat("/etc/shadow"); err != nil {
		t.Fatalf("this test needs a host /etc/shadow: %v", err)
	}
	b, name, _ := started(t, local.Options{})
	for _, user := range []string{"", "root"} {
		if r := sh(t, b, name, user, "cat /etc/shadow"); r.Code == 0 || r.Stdout != "" {
			t.Errorf("user %q read /etc/shadow: %+v", user, r)
		}
	}
	r := sh(t, b, name, "", "cat /etc/passwd")
	if r.Stdout != "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" {
		t.Fatalf("/etc/passwd inside is not the generated one: %q", r.Stdout)
	}
	if r := sh(t, b, name, "", "hostname"); strings.TrimSpace(r.Stdout) != name {
		t.Errorf("hostname = %q, want %s", r.Stdout, name)
	}
}

func TestCheckoutWritableAtWorkdir(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	r := sh(t, b, name, "", "pwd; echo made-inside > inside.txt")
	if !strings.HasPrefix(r.Stdout, local.WorkspacePath+"\n") {
		t.Fatalf("working dir: %q", r.Stdout)
	}
	checkout, err := b.GitRemote(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(checkout, "inside.txt"))
	if err != nil || string(data) != "made-inside\n" {
		t.Fatalf("host checkout inside.txt = %q, %v", data, err)
	}
	// The agent commits with git inside; the host fetches the commit.
	r = sh(t, b, name, "", "git add inside.txt && git -c user.name=A -c user.email=a@example.com commit -q -m inside && git rev-parse HEAD")
	if r.Code != 0 {
		t.Fatalf("git commit inside: %+v", r)
	}
	scratch := backendtest.NewRepo(t)
	got, err := gitx.Fetch(t.Context(), scratch.Path, checkout, "refs/heads/main", "refs/jailbee/x/main")
	if err != nil || got != strings.TrimSpace(r.Stdout) {
		t.Fatalf("fetched %q, %v; want the commit made inside %q", got, err, r.Stdout)
	}
	// The home persists across commands; /tmp does not.
	sh(t, b, name, "", "echo h > $HOME/keep; echo t > /tmp/gone")
	if r := sh(t, b, name, "", "cat $HOME/keep; cat /tmp/gone 2>/dev/null"); r.Stdout != "h\n" {
		t.Fatalf("home/tmp: %q", r.Stdout)
	}
}

func TestSocketReachableWithClientOnPath(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	if err := b.AttachSocket(t.Context(), name, backendtest.SocketDir(t, "hello from broker\n")); err != nil {
		t.Fatal(err)
	}
	r := sh(t, b, name, "", "command -v jailbee; jailbee")
	if r.Code != 0 || r.Stdout != "/run/jailbee/bin/jailbee\nhello from broker\n" {
		t.Fatalf("client inside: %+v", r)
	}
	if r := sh(t, b, name, "", "test -S "+backend.SocketMountPath+"/"+local.SocketFile+" && ! test -w "+backend.SocketMountPath); r.Code != 0 {
		t.Fatalf("socket dir is not a read-only dir with a socket: %+v", r)
	}
}

func TestPrivatePIDNamespace(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	r := sh(t, b, name, "", `cat /proc/1/comm; echo $$; ls /proc | grep -c '^[0-9]'`)
	lines := strings.Fields(r.Stdout)
	if len(lines) != 3 || lines[0] != "bwrap" {
		t.Fatalf("inside: %q, want pid 1 to be bwrap", r.Stdout)
	}
	if pid, _ := strconv.Atoi(lines[1]); pid > 3 || pid < 1 {
		t.Errorf("the command's pid inside is %s, want a fresh namespace's", lines[1])
	}
	if n, _ := strconv.Atoi(lines[2]); n > 5 {
		t.Errorf("%d processes visible inside, want only the sandbox's", n)
	}
}

func TestHostAbstractSocketUnreachable(t *testing.T) {
	client := testClient(t)
	addr := "@agentbox-test-" + randomHex(t)
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("abstract\n"))
			c.Close()
		}
	}()
	// Control: from the host the socket answers.
	if out, err := exec.Command(client, addr).Output(); err != nil || string(out) != "abstract\n" {
		t.Fatalf("host control: %q, %v", out, err)
	}
	b, name, _ := started(t, local.Options{ClientBinary: client})
	r := backendtest.Exec(t, b, name, backend.ExecOptions{Argv: []string{"jailbee", addr}})
	if r.Code == 0 || strings.Contains(r.Stdout, "abstract") {
		t.Fatalf("sandbox reached the host abstract socket: %+v", r)
	}
}

func TestEnvironmentIsCleared(t *testing.T) {
	t.Setenv("AGENTBOX_HOST_SECRET", "leak")
	t.Setenv("TERM", "xterm-test")
	b, name, _ := started(t, local.Options{})
	r := backendtest.Exec(t, b, name, backend.ExecOptions{Argv: []string{"env"}, Env: map[string]string{"EXTRA": "1"}})
	got := strings.Fields(r.Stdout)
	want := map[string]bool{
		"PATH=/run/jailbee/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin": true,
		"HOME=/home/agent": true, "USER=agent": true, "LANG=C.UTF-8": true, "TERM=xterm-test": true, "EXTRA=1": true,
		"PWD=/workspace": true, // bwrap's --chdir sets it
	}
	if len(got) != len(want) {
		t.Fatalf("environment inside = %q, want exactly %v", got, want)
	}
	for _, kv := range got {
		if !want[kv] {
			t.Errorf("unexpected %q in the environment", kv)
		}
	}
}

func TestExitStatusAndStdin(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	for _, code := range []int{0, 1, 42, 255} {
		if r := sh(t, b, name, "", "exit "+strconv.Itoa(code)); r.Code != code {
			t.Errorf("exit %d: got %d", code, r.Code)
		}
	}
	if r := sh(t, b, name, "", "kill -TERM $$"); r.Code != 128+15 {
		t.Errorf("killed by SIGTERM: got %d, want 143", r.Code)
	}
	in := strings.Repeat("line of input\n", 1000)
	r := backendtest.Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "cat > got.txt && wc -l < got.txt"}, Stdin: strings.NewReader(in)})
	if strings.TrimSpace(r.Stdout) != "1000" {
		t.Fatalf("stdin: %+v", r)
	}
}

func TestExecErrors(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	ctx := t.Context()
	cases := map[string]backend.ExecOptions{
		"empty argv":    {},
		"unknown user":  {Argv: []string{"true"}, User: "mallory"},
		"overflow uid":  {Argv: []string{"true"}, User: "65534"},
		"bad env name":  {Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}},
		"empty env key": {Argv: []string{"true"}, Env: map[string]string{"": "x"}},
	}
	for what, opts := range cases {
		if _, err := b.Exec(ctx, name, opts); err == nil {
			t.Errorf("%s: Exec succeeded", what)
		}
	}
	// A numeric uid runs as that uid.
	if r := backendtest.Exec(t, b, name, backend.ExecOptions{Argv: []string{"id", "-u"}, User: "1234"}); strings.TrimSpace(r.Stdout) != "1234" {
		t.Errorf("User 1234: %+v", r)
	}
}

func TestStopKillsRunningCommands(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	checkout, _ := b.GitRemote(t.Context(), name)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Exec(context.Background(), name, backend.ExecOptions{Argv: []string{"sh", "-c", "touch started; exec sleep 100000"}})
		errc <- err
	}()
	waitForFile(t, filepath.Join(checkout, "started"), errc)
	if err := b.Stop(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, backend.ErrNotRunning) {
		t.Fatalf("Exec ended by Stop: err = %v, want ErrNotRunning", err)
	}
}

func TestContextCancelEndsCommand(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	checkout, _ := b.GitRemote(t.Context(), name)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, name, backend.ExecOptions{Argv: []string{"sh", "-c", "touch started; exec sleep 100000"}})
		errc <- err
	}()
	waitForFile(t, filepath.Join(checkout, "started"), errc)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestStateSurvivesReopen(t *testing.T) {
	root := filepath.Join(t.TempDir(), "sandboxes")
	b1, name, _ := started(t, local.Options{Root: root})
	sock := backendtest.SocketDir(t, "still here\n")
	if err := b1.AttachSocket(t.Context(), name, sock); err != nil {
		t.Fatal(err)
	}
	before, _ := b1.List(t.Context())
	b2 := newBackend(t, local.Options{Root: root, ClientBinary: testClient(t)})
	after, err := b2.List(t.Context())
	if err != nil || len(after) != 1 || after[0] != before[0] || !after[0].Running {
		t.Fatalf("after reopen List = %+v, %v; want %+v", after, err, before)
	}
	if r := backendtest.Exec(t, b2, name, backend.ExecOptions{Argv: []string{"jailbee"}}); r.Stdout != "still here\n" {
		t.Fatalf("socket after reopen: %+v", r)
	}
}

func TestCreateDoesNotHardlinkSourceObjects(t *testing.T) {
	requireBwrap(t)
	b := newBackend(t, local.Options{})
	repo := backendtest.NewRepo(t)
	name := backendtest.Name(t, "nolink")
	backendtest.Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
	checkout, _ := b.GitRemote(t.Context(), name)
	if _, err := os.Stat(filepath.Join(checkout, ".git", "objects", "info", "alternates")); err == nil {
		t.Fatal("checkout borrows the source's objects through alternates")
	}
	err := filepath.WalkDir(filepath.Join(repo.Path, ".git", "objects"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		src, err := os.Stat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repo.Path, p)
		if dst, err := os.Stat(filepath.Join(checkout, rel)); err == nil && os.SameFile(src, dst) {
			t.Errorf("%s is shared with the sandbox", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDestroyRefusesSymlink(t *testing.T) {
	root := filepath.Join(t.TempDir(), "sandboxes")
	b := newBackend(t, local.Options{Root: root})
	victim := t.TempDir()
	if err := os.WriteFile(filepath.Join(victim, "precious"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(root, "evil")); err != nil {
		t.Fatal(err)
	}
	if err := b.Destroy(t.Context(), "evil"); err == nil {
		t.Fatal("Destroy followed a symlinked sandbox dir")
	}
	if _, err := os.Stat(filepath.Join(victim, "precious")); err != nil {
		t.Fatalf("symlink target damaged: %v", err)
	}
	if list, err := b.List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("List = %+v, %v; a symlink is no sandbox", list, err)
	}
}

func TestDestroyRemovesReadOnlyTrees(t *testing.T) {
	b, name, _ := started(t, local.Options{})
	sh(t, b, name, "", "mkdir -p $HOME/mod/pkg && touch $HOME/mod/pkg/f && chmod -R a-w $HOME/mod")
	checkout, _ := b.GitRemote(t.Context(), name)
	if err := b.Destroy(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Dir(checkout)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sandbox dir still there: %v", err)
	}
}

func TestCreateRecoversFromInterruptedCreate(t *testing.T) {
	root := filepath.Join(t.TempDir(), "sandboxes")
	b := newBackend(t, local.Options{Root: root})
	// What a crash in the middle of Create leaves: a directory, no metadata.
	if err := os.MkdirAll(filepath.Join(root, "half", "checkout"), 0o700); err != nil {
		t.Fatal(err)
	}
	if list, _ := b.List(t.Context()); len(list) != 0 {
		t.Fatalf("List shows an unfinished sandbox: %+v", list)
	}
	if err := b.Start(t.Context(), "half"); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Start on an unfinished sandbox: %v, want ErrNotFound", err)
	}
	repo := backendtest.NewRepo(t)
	if _, err := b.Create(t.Context(), backend.CreateOptions{Name: "half", Source: backend.GitSource{Repo: repo.Path, Branch: "main"}}); err != nil {
		t.Fatalf("Create over an interrupted create: %v", err)
	}
}

func TestInsecureExportsSocket(t *testing.T) {
	t.Setenv("AGENTBOX_HOST_SECRET", "leak")
	b, name, _ := started(t, local.Options{Insecure: true})
	sock := backendtest.SocketDir(t, "insecure hello\n")
	if err := b.AttachSocket(t.Context(), name, sock); err != nil {
		t.Fatal(err)
	}
	checkout, _ := b.GitRemote(t.Context(), name)
	r := sh(t, b, name, "", `echo "$JAILBEE_ORCHESTRATION_SOCKET"; pwd; echo "secret=$AGENTBOX_HOST_SECRET"; jailbee`)
	want := filepath.Join(sock, "broker.sock") + "\n" + checkout + "\nsecret=\ninsecure hello\n"
	if r.Code != 0 || r.Stdout != want {
		t.Fatalf("insecure: %+v, want stdout %q", r, want)
	}
	if err := b.DetachSocket(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if r := sh(t, b, name, "", `echo "${JAILBEE_ORCHESTRATION_SOCKET-unset}"`); r.Stdout != "unset\n" {
		t.Fatalf("after detach: %q", r.Stdout)
	}
}

// pollInterval paces waitForFile; the test's own deadline bounds it.
const pollInterval = 10 * time.Millisecond

// waitForFile waits until the command running behind errc has made path;
// it fails the test if the command ends first.
func waitForFile(t *testing.T, path string, errc <-chan error) {
	t.Helper()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case err := <-errc:
			t.Fatalf("command ended before making %s: %v", filepath.Base(path), err)
		case <-time.After(pollInterval):
		}
	}
}

func randomHex(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}
