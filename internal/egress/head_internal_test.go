package egress

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
)

// FuzzReadHead feeds untrusted bytes to the request-head parser: it must
// never panic, never read past MaxHeadBytes, never accept more than
// MaxRequestHeaderLines headers, and whatever it accepts names a checked
// host and a real port.
func FuzzReadHead(f *testing.F) {
	for _, s := range []string{
		"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n",
		"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
		"GET http://example.com/a?b=c HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST http://10.0.0.1:8080/ HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc",
		"GET https://example.com/ HTTP/1.1\r\n\r\n",
		"CONNECT a_b:1 HTTP/1.1\r\n\r\n",
		"CONNECT *.x.org:443 HTTP/1.1\r\n\r\n",
		"GET http://u:p@h/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"CONNECT a.org:1 HTTP/1.1\n" + strings.Repeat("a:\n", MaxRequestHeaderLines+1) + "\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src := bytes.NewReader(data)
		lr := &io.LimitedReader{R: src, N: MaxHeadBytes}
		hl := newHeadLines(lr, MaxRequestHeaderLines, true)
		rq, err := readHead(bufio.NewReader(hl), hl, lr)
		if read := int64(len(data)) - int64(src.Len()); read > MaxHeadBytes {
			t.Fatalf("read %d bytes of the head", read)
		}
		if err == nil && len(rq.req.Header) > MaxRequestHeaderLines {
			t.Fatalf("a head of %d headers accepted", len(rq.req.Header))
		}
		if err != nil {
			var he *httpError
			if !errors.As(err, &he) && !errors.Is(err, errNoRequest) {
				t.Fatalf("error %v is no answer", err)
			}
			if he != nil && (strings.Contains(he.msg, "\n") || he.status < 400) {
				t.Fatalf("answer %d %q", he.status, he.msg)
			}
			return
		}
		if rq.port == 0 {
			t.Fatal("port 0 accepted")
		}
		if h, err := checkHost(rq.host); err != nil || h != rq.host {
			t.Fatalf("host %q accepted unchecked", rq.host)
		}
	})
}

func TestRefusal(t *testing.T) {
	// The host: a public IPv4 address on a /24, an IPv6 one on a /48
	// (refused as its /64), one on a /8 (refused as its /16).
	own := []netip.Prefix{
		ownNetwork(netip.MustParsePrefix("81.2.69.9/24")),
		ownNetwork(netip.MustParsePrefix("2a00:1450:1::9/48")),
		ownNetwork(netip.MustParsePrefix("11.0.0.5/8")),
		ownNetwork(netip.MustParsePrefix("198.18.0.9/16")), // a fake-address TUN: its address alone
	}
	tests := map[string]string{
		"93.184.215.14":    "",
		"2606:4700::1111":  "",
		"127.0.0.1":        "a loopback address",
		"127.255.0.3":      "a loopback address",
		"::1":              "a loopback address",
		"::ffff:127.0.0.1": "a loopback address",
		"10.1.2.3":         "a private address",
		"172.16.0.1":       "a private address",
		"192.168.1.1":      "a private address",
		"fd12::1":          "a private address",
		"fec0::1":          "a private address",
		"169.254.169.254":  "a link-local address",
		"fe80::1":          "a link-local address",
		"0.0.0.0":          "an unspecified address",
		"::":               "an unspecified address",
		"0.1.2.3":          "a reserved address",
		"255.255.255.255":  "a reserved address",
		"100.64.1.1":       "a shared address",
		"224.0.0.251":      "a link-local address",
		"239.1.1.1":        "a multicast address",
		"ff05::2":          "a multicast address",
		"64:ff9b::a00:1":   "a translated address",
		"192.0.0.170":      "a reserved address",
		// Documentation and benchmarking ranges stand for public hosts
		// on some networks (fake-address resolvers, test networks).
		"192.0.2.1":          "",
		"198.18.0.1":         "",
		"198.51.100.7":       "",
		"203.0.113.10":       "",
		"2001:db8::1":        "",
		"168.63.129.16":      "a cloud platform address",
		"168.63.129.17":      "",
		"::7f00:1":           "a translated address",
		"::ffff:0:7f00:1":    "a translated address",
		"2002:7f00:1::":      "a translated address",
		"2001:0:7f00:1::":    "a translated address",
		"2001:4860::8888":    "",
		"100::1":             "a reserved address",
		"81.2.69.9":          "an address of this host",
		"::ffff:81.2.69.9":   "an address of this host",
		"81.2.69.1":          "an address on this host's network",
		"::ffff:81.2.69.200": "an address on this host's network",
		"81.2.70.1":          "",
		"2a00:1450:1::9":     "an address of this host",
		"2a00:1450:1::1":     "an address on this host's network",
		"2a00:1450:1:2::1":   "",
		"11.0.200.1":         "an address on this host's network",
		"11.1.0.1":           "",
		"198.18.0.9":         "an address of this host",
		"198.18.7.7":         "",
	}
	for in, want := range tests {
		if got := refusal(netip.MustParseAddr(in), own); got != want {
			t.Errorf("refusal(%s) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckHost(t *testing.T) {
	tests := map[string]string{
		"PyPI.org":         "pypi.org",
		"pypi.org.":        "pypi.org",
		"127.0.0.1":        "127.0.0.1",
		"::ffff:127.0.0.1": "127.0.0.1",
		"2001:DB8::1":      "2001:db8::1",
		"*.pypi.org":       "",
		"a_b.org":          "",
		"fe80::1%lo":       "",
		"":                 "",
		"a..b":             "",
		"-a.org":           "",
		"pypi.org..":       "",
	}
	for in, want := range tests {
		got, err := checkHost(in)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("checkHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestGrantedLiteral(t *testing.T) {
	tests := []struct {
		host, right string
		want        bool
	}{
		{"127.0.0.1", "127.0.0.1", true},
		{"127.0.0.1", "*.0.0.1", false},
		{"127.0.0.1", "loose", false},
		{"evil.example", "evil.example", false},
	}
	for _, tt := range tests {
		if got := grantedLiteral(tt.host, tt.right); got != tt.want {
			t.Errorf("grantedLiteral(%q, %q) = %v", tt.host, tt.right, got)
		}
	}
}
