package term

import (
	"errors"
	"os"
	"testing"
	"time"
)

// TestCloseEndsAReadWhileTheSlaveIsHeld: closing a master ends a Read
// blocked on it while its slave is still open (as a sandbox process that
// keeps the command's terminal holds it), also after the size and mode
// calls: exec -t's output copy must end.
func TestCloseEndsAReadWhileTheSlaveIsHeld(t *testing.T) {
	master, slave, err := OpenPTY()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer slave.Close()
	if err := CopySize(master, slave); err != nil {
		t.Fatal(err)
	}
	restore, err := MakeRaw(slave)
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	first := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 16)
		if _, err := master.Read(buf); err != nil {
			done <- err
			return
		}
		close(first)
		_, err := master.Read(buf) // blocks: nothing more is written
		done <- err
	}()
	slave.Write([]byte("x"))
	<-first
	master.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("the blocked Read ended with %v, want os.ErrClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("closing the master did not end a Read blocked on it (hang guard)")
	}
}
