package forge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/go-github/v74/github"

	"agentbox/internal/secfs"
	"agentbox/internal/untrusted"
)

// Config is how New reaches the forge.
type Config struct {
	// APIURL is the REST API's base URL (broker.yaml forge.api_url).
	APIURL string
	// Token is the host's token, sent as a bearer token.
	Token string
	// Timeout bounds one call; 0 is RequestTimeout.
	Timeout time.Duration
}

// GitHub is the Forge of GitHub's REST API.
type GitHub struct {
	client *github.Client
	token  string
}

var _ Forge = (*GitHub)(nil)

// New returns the forge at c.APIURL, authenticated with c.Token.
func New(c Config) (*GitHub, error) {
	if c.Token == "" {
		return nil, ErrNoToken
	}
	if !secfs.IsSingleToken(c.Token) {
		return nil, errors.New("forge: the token holds characters other than visible ASCII (one token, no spaces)")
	}
	base, err := url.Parse(c.APIURL)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" || base.User != nil {
		return nil, errors.New("forge: the API URL must be an http or https URL without credentials")
	}
	if !strings.HasSuffix(base.Path, "/") {
		base.Path += "/"
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = RequestTimeout
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxResponseHeaderBytes = MaxResponseBytes
	hc := &http.Client{
		Timeout:   timeout,
		Transport: limitBodies{transport},
		// A redirect would carry the request elsewhere: refused, the 3xx
		// is the answer.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	client := github.NewClient(hc).WithAuthToken(c.Token)
	client.BaseURL = base
	client.UserAgent = "jailbee"
	return &GitHub{client: client, token: c.Token}, nil
}

// limitBodies bounds every answer's body to MaxResponseBytes.
type limitBodies struct{ next http.RoundTripper }

func (l limitBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if resp != nil && resp.Body != nil {
		resp.Body = &limitedBody{ReadCloser: resp.Body, left: MaxResponseBytes}
	}
	return resp, err
}

// errTooLarge ends an answer past MaxResponseBytes.
var errTooLarge = errors.New("answer too large")

type limitedBody struct {
	io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// call runs one API call: the request is built and sent by do; its
// outcome becomes nil or an *Error for op.
func (g *GitHub) call(ctx context.Context, op string, do func(ctx context.Context) (*github.Response, error)) error {
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		// From the moment a connection is ours, bytes of the request may
		// have reached the forge.
		GotConn: func(httptrace.GotConnInfo) { sent.Store(true) },
	})
	resp, err := do(ctx)
	if err == nil {
		return nil
	}
	return g.classify(op, resp, err, sent.Load())
}

// classify turns a failed call into an *Error: an answer with a status
// under 500 (other than 2xx) is a certain refusal; a 5xx, a 2xx that
// could not be read, or no answer after the request went out is uncertain.
func (g *GitHub) classify(op string, resp *github.Response, err error, sent bool) *Error {
	if resp != nil && resp.Response != nil {
		code := resp.StatusCode
		e := &Error{Op: op, Status: code, Msg: g.answerMessage(err)}
		switch {
		case code >= 200 && code < 300:
			e.Msg = "the answer could not be read"
		case code < 500:
			e.Certain = true
		}
		return e
	}
	e := &Error{Op: op, Certain: !sent}
	var ne interface{ Timeout() bool }
	switch {
	case errors.Is(err, context.Canceled):
		e.Msg = "cancelled"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		e.Msg = "no answer in time"
	case sent:
		e.Msg = "the connection was lost"
	default:
		e.Msg = "cannot connect"
	}
	return e
}

// answerMessage is the forge's own message in an error answer, made safe.
func (g *GitHub) answerMessage(err error) string {
	var er *github.ErrorResponse
	var rl *github.RateLimitError
	var arl *github.AbuseRateLimitError
	var msg string
	switch {
	case errors.As(err, &er):
		msg = er.Message
		if len(er.Errors) > 0 {
			// A validation error says what is wrong in its first entry:
			// a sentence, or a field and a code ("title missing_field").
			first := er.Errors[0]
			detail := first.Message
			if detail == "" {
				detail = strings.TrimSpace(first.Field + " " + first.Code)
			}
			if detail != "" {
				msg += ": " + detail
			}
		}
	case errors.As(err, &rl):
		msg = "rate limited"
	case errors.As(err, &arl):
		msg = "secondary rate limit"
	}
	return safeMessage(msg, g.token)
}

// safeMessage is s with the token removed, control and other unprintable
// characters replaced, at most MaxMessageBytes.
func safeMessage(s, token string) string {
	if token != "" {
		s = strings.ReplaceAll(s, token, "[token]")
	}
	s = strings.TrimSpace(untrusted.Printable(s))
	if len(s) <= MaxMessageBytes {
		return s
	}
	cut := MaxMessageBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// refused is a call refused before anything was sent.
func refused(op, format string, args ...any) *Error {
	return &Error{Op: op, Certain: true, Msg: fmt.Sprintf(format, args...)}
}
