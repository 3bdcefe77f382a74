// Package egress is the broker's egress proxy for one sandbox: the only
// way out of a sandbox that keeps no route of its own. It speaks HTTP on
// a listener the broker hands it (the sandbox's egress socket): CONNECT
// host:port opens a tunnel (TLS goes through it), and a plain request with
// an absolute http:// URL is forwarded, one request per connection.
//
// Each connection is decided on its own: the sandbox's current rights
// (Policy) must allow the host, the host's resolver resolves the name, and
// loopback, private, link-local, shared, reserved, translated and
// multicast addresses and the host's own are refused unless the
// destination is an address literal granted as such. The proxy dials the
// address it checked, never the name again, so an answer that changes between check and dial
// (DNS rebinding) cannot steer it. Refusals are answered 403 with a
// one-line reason; failures to reach the destination 502, or 504 when it
// timed out. Every connection that sent a request ends in one Record; past
// RefusalLogBurst a second, refusals are counted into one summary Record
// instead, as are connections that sent nothing.
//
// Live connections are kept per right that allowed them: CloseRight cuts
// those of a revoked or expired right.
package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"agentbox/internal/loglimit"
)

// Verdict is how a connection ended.
type Verdict string

const (
	Allowed Verdict = "allowed" // connected and ran to its end
	Refused Verdict = "refused" // answered 4xx: not granted, a refused address, a bad request
	Failed  Verdict = "failed"  // answered 502/504: the destination could not be reached
	Revoked Verdict = "revoked" // cut by CloseRight or the proxy's end
)

// Record is the log record of one connection, given to Config.Log when it
// has ended; or the summary of the connections a period did not log one
// by one (Host empty, Reason says how many: RefusalLogBurst).
type Record struct {
	Sandbox  string
	Host     string // "" when the request named none
	Port     uint16
	Right    string // the right that allowed it ("" when refused)
	Up, Down int64  // bytes to the destination and back to the client (bodies and tunnel data)
	Verdict  Verdict
	Reason   string // why it was refused, failed or revoked; "" when allowed
	Duration time.Duration
}

// Resolver resolves a host name on the host (net.DefaultResolver). The
// name it gets is rooted (a trailing dot), so no search domain applies.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config is one sandbox's proxy.
type Config struct {
	Sandbox  string       // named in each Record
	Policy   Policy       // the sandbox's rights; nil allows nothing (Deny)
	Resolver Resolver     // nil: net.DefaultResolver
	Log      func(Record) // nil logs nothing
	// HeadTimeout replaces the package's HeadTimeout when set (tests
	// shorten it).
	HeadTimeout time.Duration
	// HalfClosedTimeout replaces the package's HalfClosedTimeout when set
	// (tests shorten it).
	HalfClosedTimeout time.Duration
	// ClientIdleTimeout replaces the package's ClientIdleTimeout when set
	// (tests shorten it).
	ClientIdleTimeout time.Duration
	// RefusalLogPeriod replaces the package's RefusalLogPeriod when set
	// (tests lengthen it).
	RefusalLogPeriod time.Duration
	// AdmitConn, when set, is asked for each connection within MaxConns
	// before it is served: the broker's budget of connections across
	// sandboxes. An error refuses the connection with 503 and the error's
	// message; release gives the place back when the connection ends.
	AdmitConn func() (release func(), err error)
}

// Proxy is one sandbox's egress proxy.
type Proxy struct {
	cfg   Config
	conns atomic.Int32

	mu     sync.Mutex
	policy Policy
	live   map[*liveConn]struct{}

	// logs bounds the records of refusals, of failures that passed no
	// byte and of silent connections: RefusalLogBurst per period, the
	// rest summed up by kind (refusedKind, failedKind, silentKind).
	logs *loglimit.Limiter
}

// The kinds of records logs counts.
const (
	refusedKind = iota
	failedKind
	silentKind
	kinds
)

// liveConn is one allowed connection: the right that allowed it, and how
// to cut it.
type liveConn struct {
	right   string
	cut     context.CancelFunc
	revoked atomic.Bool
}

// New returns the proxy of one sandbox.
func New(cfg Config) *Proxy {
	if cfg.Policy == nil {
		cfg.Policy = Deny{}
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.HeadTimeout <= 0 {
		cfg.HeadTimeout = HeadTimeout
	}
	if cfg.HalfClosedTimeout <= 0 {
		cfg.HalfClosedTimeout = HalfClosedTimeout
	}
	if cfg.ClientIdleTimeout <= 0 {
		cfg.ClientIdleTimeout = ClientIdleTimeout
	}
	if cfg.RefusalLogPeriod <= 0 {
		cfg.RefusalLogPeriod = RefusalLogPeriod
	}
	p := &Proxy{cfg: cfg, policy: cfg.Policy, live: map[*liveConn]struct{}{}}
	p.logs = loglimit.New(RefusalLogBurst, cfg.RefusalLogPeriod, kinds, p.logSummary)
	return p
}

// SetPolicy replaces the sandbox's rights for every later connection.
// Connections already open keep going: after taking a right away, call
// CloseRight for it.
func (p *Proxy) SetPolicy(pol Policy) {
	if pol == nil {
		pol = Deny{}
	}
	p.mu.Lock()
	p.policy = pol
	p.mu.Unlock()
}

// CloseRight cuts every live connection that right allowed and returns
// how many. Called after SetPolicy has taken the right away, it leaves
// none: a connection is decided and recorded under one lock.
func (p *Proxy) CloseRight(right string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for lc := range p.live {
		if lc.right == right {
			lc.revoked.Store(true)
			lc.cut()
			n++
		}
	}
	return n
}

// admit asks the policy about host:port and, when it allows them, records
// the connection as live under the right that allowed it.
func (p *Proxy) admit(host string, port uint16, cut context.CancelFunc) (*liveConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	right, err := p.policy.Allow(host, port)
	if err == nil && right == "" {
		err = fmt.Errorf("egress to %s is not granted to this sandbox", host)
	}
	if err != nil {
		return nil, err
	}
	lc := &liveConn{right: right, cut: cut}
	p.live[lc] = struct{}{}
	return lc, nil
}

func (p *Proxy) release(lc *liveConn) {
	p.mu.Lock()
	delete(p.live, lc)
	p.mu.Unlock()
}

// Serve answers connections on ln until ctx ends, then closes ln and every
// connection and returns nil once their handlers have ended. An accept
// error other than ln's closing never ends it: it backs off and retries.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer p.logs.Flush() // what was counted is not left unsaid
	var wg sync.WaitGroup
	defer wg.Wait()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		delay = 0
		if p.conns.Add(1) > MaxConns {
			p.conns.Add(-1)
			p.refuseBusy(c, fmt.Sprintf("more than %d connections at once from this sandbox", MaxConns))
			continue
		}
		release := func() {}
		if p.cfg.AdmitConn != nil {
			if release, err = p.cfg.AdmitConn(); err != nil {
				p.conns.Add(-1)
				p.refuseBusy(c, err.Error())
				continue
			}
		}
		wg.Go(func() {
			defer p.conns.Add(-1)
			defer release()
			p.handle(ctx, c)
		})
	}
}

func (p *Proxy) refuseBusy(c net.Conn, msg string) {
	e := &httpError{http.StatusServiceUnavailable, msg}
	writeError(c, e, time.Second)
	c.Close()
	p.log(Record{Sandbox: p.cfg.Sandbox, Verdict: Refused, Reason: e.msg})
}

// log hands r to Config.Log; a refusal, or a failure that passed no byte
// (a closed port, a name that does not resolve), past the period's
// RefusalLogBurst is only counted for the summary. A failure that moved
// bytes to or from a destination is always logged: what reached a host
// the sandbox holds a right to is never only counted.
func (p *Proxy) log(r Record) {
	if p.cfg.Log == nil {
		return
	}
	if r.Verdict == Refused && !p.logs.Admit(refusedKind) ||
		r.Verdict == Failed && r.Up == 0 && r.Down == 0 && !p.logs.Admit(failedKind) {
		return
	}
	p.cfg.Log(r)
}

// countSilent counts a connection that closed without sending a request:
// it is never logged on its own, only in the summary.
func (p *Proxy) countSilent() {
	if p.cfg.Log == nil {
		return
	}
	p.logs.Count(silentKind)
}

// logSummary writes one record of what logs counted and did not log.
func (p *Proxy) logSummary(counts []int) {
	dropped, failed, silent := counts[refusedKind], counts[failedKind], counts[silentKind]
	var parts []string
	if dropped > 0 {
		parts = append(parts, fmt.Sprintf("%d more refused %s not logged", dropped, plural(dropped, "connection")))
	}
	if failed > 0 {
		parts = append(parts, fmt.Sprintf("%d more failed %s not logged", failed, plural(failed, "connection")))
	}
	if silent > 0 {
		parts = append(parts, fmt.Sprintf("%d %s closed without a request", silent, plural(silent, "connection")))
	}
	if len(parts) > 0 && p.cfg.Log != nil {
		p.cfg.Log(Record{Sandbox: p.cfg.Sandbox, Verdict: Refused, Reason: strings.Join(parts, "; ")})
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// handle serves one client connection: one request head, then a tunnel or
// one forwarded request.
func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	start := time.Now()
	rec := Record{Sandbox: p.cfg.Sandbox}
	silent := false
	defer func() {
		if silent {
			p.countSilent()
			return
		}
		rec.Duration = time.Since(start)
		p.log(rec)
	}()
	ctx, cut := context.WithCancel(ctx)
	defer cut()
	defer c.Close()
	context.AfterFunc(ctx, func() { c.Close() })

	lr := &io.LimitedReader{R: c, N: MaxHeadBytes}
	hl := newHeadLines(lr, MaxRequestHeaderLines, true)
	br := bufio.NewReader(hl)
	c.SetReadDeadline(time.Now().Add(p.cfg.HeadTimeout))
	rq, err := readHead(br, hl, lr)
	if errors.Is(err, errNoRequest) {
		silent = true // nothing to answer
		return
	}
	if err != nil {
		p.fail(c, &rec, err)
		return
	}
	c.SetReadDeadline(time.Time{})
	lr.N = math.MaxInt64
	rec.Host, rec.Port = rq.host, rq.port

	lc, err := p.admit(rq.host, rq.port, cut)
	if err != nil {
		p.fail(c, &rec, refused(err.Error()))
		return
	}
	defer p.release(lc)
	rec.Right = lc.right
	up, err := p.dial(ctx, rq.host, rq.port, lc.right)
	if err == nil {
		defer up.Close()
		context.AfterFunc(ctx, func() { up.Close() })
		if rq.connect {
			rec.Up, rec.Down = tunnel(c, br, up, p.cfg.HalfClosedTimeout)
		} else {
			rec.Up, rec.Down, err = forward(c, rq.req, up, p.cfg.ClientIdleTimeout)
		}
	}
	switch {
	case lc.revoked.Load():
		rec.Verdict, rec.Reason = Revoked, "the right "+lc.right+" was taken away"
	case ctx.Err() != nil:
		rec.Verdict, rec.Reason = Revoked, "the proxy stopped"
	case err != nil:
		p.fail(c, &rec, err)
	default:
		rec.Verdict = Allowed
	}
}

// fail records err and answers it when it is an httpError. Any other
// error broke a connection whose answer had begun: there is nothing left
// to say.
func (p *Proxy) fail(c net.Conn, rec *Record, err error) {
	var he *httpError
	switch {
	case errors.As(err, &he):
		rec.Verdict, rec.Reason = Failed, he.msg
		if he.status < 500 {
			rec.Verdict = Refused
		}
		writeError(c, he, replyTimeout)
	case errors.Is(err, errClientLeft), errors.Is(err, errDestinationIdle):
		rec.Verdict, rec.Reason = Failed, err.Error()
	default:
		rec.Verdict, rec.Reason = Failed, "the connection broke midway"
	}
}

// writeError answers e: its status and its reason as a one-line body; the
// connection ends with it.
func writeError(c net.Conn, e *httpError, timeout time.Duration) {
	c.SetWriteDeadline(time.Now().Add(timeout))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n",
		e.status, http.StatusText(e.status), len(e.msg)+1, e.msg)
}

// dial resolves host on the host, refuses the addresses a sandbox may not
// reach (unless host is an address literal granted as such: right), and
// connects to the first of the checked addresses that answers.
func (p *Proxy) dial(ctx context.Context, host string, port uint16, right string) (net.Conn, error) {
	addrs, err := p.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	if !grantedLiteral(host, right) {
		if err := checkAddrs(host, addrs); err != nil {
			return nil, err
		}
	}
	// One bound for every address together: a name with many addresses
	// that drop what is sent to them would otherwise hold the slot for
	// DialTimeout each.
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	var d net.Dialer
	for _, a := range addrs {
		c, derr := d.DialContext(dctx, "tcp", netip.AddrPortFrom(a.Unmap(), port).String())
		if derr == nil {
			return c, nil
		}
		err = derr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return nil, &httpError{http.StatusGatewayTimeout, fmt.Sprintf("connecting to %s port %d timed out", host, port)}
	}
	return nil, &httpError{http.StatusBadGateway, fmt.Sprintf("could not connect to %s port %d", host, port)}
}

// resolve returns host's addresses: the literal itself, or the resolver's
// answer for the rooted name.
func (p *Proxy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	rctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	addrs, err := p.cfg.Resolver.LookupNetIP(rctx, "ip", host+".")
	switch {
	case err == nil && len(addrs) > 0:
		return addrs, nil
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return nil, &httpError{http.StatusGatewayTimeout, "resolving " + host + " timed out"}
	}
	return nil, &httpError{http.StatusBadGateway, "could not resolve " + host}
}

// checkAddrs refuses the whole destination when any of its addresses is
// one a sandbox may not reach: a name that also points inward is not
// half-trusted.
func checkAddrs(host string, addrs []netip.Addr) error {
	own, err := hostAddrs()
	if err != nil {
		return &httpError{http.StatusBadGateway, "the host's own addresses could not be read"}
	}
	for _, a := range addrs {
		why := refusal(a, own)
		if why == "" {
			continue
		}
		if _, err := netip.ParseAddr(host); err == nil {
			return refused(fmt.Sprintf("egress to %s refused: %s (only an address granted as such may be one)", host, why))
		}
		return refused(fmt.Sprintf("egress to %s refused: it resolves to %s", host, why))
	}
	return nil
}
