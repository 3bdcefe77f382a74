package broker_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/wire"
)

// Memory budget: one broker serving memSandboxes sandboxes, each holding
// broker.MaxConnsPerSandbox idle connections, stays under memBudgetMiB
// resident.
const (
	memSandboxes = 200
	memBudgetMiB = 200
)

// vmRSS reads a process's resident set size (VmRSS) and its peak (VmHWM),
// in KiB, from /proc/PID/status.
func vmRSS(t testing.TB, pid int) (rss, hwm int64) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = n
		case "VmHWM:":
			hwm = n
		}
	}
	if rss == 0 {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm
}

func TestMemory200SandboxesWith1600IdleConnections(t *testing.T) {
	bin, state, repo := jailbeeBin(t), shortTempDir(t), makeRepo(t)
	p := startProcBroker(t, bin, state)
	idle, _ := vmRSS(t, p.pid())

	start := time.Now()
	for i := range memSandboxes {
		name := fmt.Sprintf("o%03d", i)
		p.newSandbox(wire.NewArgs{Name: name, Repo: repo, Role: "orchestrator"})
	}
	created := time.Since(start)
	var list []wire.SandboxInfo
	if err := p.adminCall("ls", nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != memSandboxes {
		t.Fatalf("ls shows %d sandboxes, want %d", len(list), memSandboxes)
	}

	conns := 0
	for _, sb := range list {
		if sb.Socket == nil {
			t.Fatalf("sandbox %s has no socket", sb.Name)
		}
		for range broker.MaxConnsPerSandbox {
			c, err := net.Dial("unix", *sb.Socket)
			if err != nil {
				t.Fatalf("connection %d: %v", conns+1, err)
			}
			t.Cleanup(func() { c.Close() })
			conns++
		}
		// The sandbox really holds all its connections: one more is busy.
		extra, err := net.Dial("unix", *sb.Socket)
		if err != nil {
			t.Fatal(err)
		}
		extra.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := wire.ReadLine(bufio.NewReader(extra), wire.MaxLineBytes)
		extra.Close()
		if err != nil || !strings.Contains(string(line), `"busy"`) {
			t.Fatalf("connection %d to %s: %q, %v; want busy (the first %d are held)",
				broker.MaxConnsPerSandbox+1, sb.Name, line, err, broker.MaxConnsPerSandbox)
		}
	}
	// Let the rounds and the accept loops settle before reading.
	time.Sleep(2 * time.Second)
	rss, hwm := vmRSS(t, p.pid())
	t.Logf("broker VmRSS: %.1f MiB with %d sandboxes and %d idle connections (peak VmHWM %.1f MiB; %.1f MiB with none; %d sandboxes created in %s)",
		float64(rss)/1024, memSandboxes, conns, float64(hwm)/1024, float64(idle)/1024, memSandboxes, created.Round(time.Millisecond))
	if rss > memBudgetMiB*1024 {
		t.Fatalf("broker VmRSS %.1f MiB exceeds %d MiB", float64(rss)/1024, memBudgetMiB)
	}
}
