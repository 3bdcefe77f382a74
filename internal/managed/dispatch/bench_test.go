package dispatch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"agentbox/internal/managed/endpoint"
	"agentbox/internal/managed/spool"
)

// BenchmarkDispatch measures one tool request's dispatch (staging, the
// checks, the durable claim, the relay, the durable record, the
// consumer's file) against its floor in the same run: a bare relay of
// the same frame to the same endpoint plus one fsync'd write of the
// response. It also measures a replay of a recorded response, which must
// not reach the endpoint. Root is needed (the consumer's files are
// chowned); run it with
//
//	go test -run - -bench Dispatch ./internal/managed/dispatch
func BenchmarkDispatch(b *testing.B) {
	w := newWorld(b, true)
	w.serve()
	frame := mustEnvelope(b, envelope("bench", `{"n":1}`)).Frame()
	var bare time.Duration
	b.Run("bare-relay-fsync", func(b *testing.B) {
		out := filepath.Join(b.TempDir(), "response")
		start := time.Now()
		for i := 0; i < b.N; i++ {
			raw, err := endpoint.Relay(context.Background(), w.s.Endpoint, frame)
			if err != nil {
				b.Fatal(err)
			}
			f, err := os.Create(out)
			if err != nil {
				b.Fatal(err)
			}
			f.Write(raw)
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		bare = time.Since(start) / time.Duration(b.N)
	})
	b.Run("dispatch", func(b *testing.B) {
		var spent time.Duration
		for i := 0; i < b.N; i++ {
			id := fmt.Sprintf("d%d-%d", b.N, i)
			b.StopTimer()
			w.put(id+".json", envelope(id, `{"n":1}`))
			b.StartTimer()
			t0 := time.Now()
			if _, err := w.dispatch(id, 0); err != nil {
				b.Fatal(err)
			}
			spent += time.Since(t0)
		}
		if bare > 0 {
			b.ReportMetric(float64(spent/time.Duration(b.N))/float64(bare), "x-bare")
		}
	})
	b.Run("cached-replay", func(b *testing.B) {
		w.put("cached.json", envelope("cached", `{}`))
		if _, err := w.dispatch("cached", 0); err != nil {
			b.Fatal(err)
		}
		before := w.count("cached")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			out, err := w.dispatch("cached", 0)
			if err != nil || !out.Cached {
				b.Fatalf("%+v %v", out, err)
			}
		}
		b.StopTimer()
		if w.count("cached") != before {
			b.Fatal("a replay reached the endpoint")
		}
	})
}

func mustEnvelope(b testing.TB, data string) *spool.Envelope {
	e, err := spool.DecodeEnvelope([]byte(data))
	if err != nil {
		b.Fatal(err)
	}
	return e
}
