package devcontainer_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"agentbox/internal/managed/devcontainer"
)

const source = `// The repository's devcontainer
{
	"name": "app // not a comment",
	"dockerComposeFile": ["../compose.yaml", "compose.dev.yaml",],
	"service": "app",
	"workspaceFolder": "/workspaces/app",
	"remoteUser": "dev",
	/* host-facing keys, all dropped */
	"mounts": ["source=/,target=/host,type=bind"],
	"workspaceMount": "source=/,target=/w,type=bind",
	"forwardPorts": [3000],
	"appPort": [8080],
	"capAdd": ["SYS_ADMIN"],
	"runArgs": ["--privileged"],
	"securityOpt": ["seccomp=unconfined"],
	"privileged": true,
	"remoteEnv": {"TOKEN": "x"},
	/* applied to the container by the CLI, which a managed launch creates first */
	"containerEnv": {"MODE": "dev"},
	"overrideCommand": true,
	"features": {"ghcr.io/devcontainers/features/docker-in-docker:2": {}},
	"updateRemoteUserUID": true,
	"postCreateCommand": "make deps",
	"customizations": {"vscode": {"extensions": ["golang.go"]}},
}
`

// cfgPath is where the configs of these tests are, for messages.
const cfgPath = ".devcontainer/devcontainer.json"

func TestParseAndGenerate(t *testing.T) {
	c, err := devcontainer.Parse(cfgPath, []byte(source))
	if err != nil {
		t.Fatal(err)
	}
	files, set, err := c.ComposeFiles()
	if err != nil || !set || !reflect.DeepEqual(files, []string{"../compose.yaml", "compose.dev.yaml"}) {
		t.Fatalf("ComposeFiles = %q %v %v", files, set, err)
	}
	if c.Service() != "app" || c.User() != "dev" {
		t.Fatalf("service %q user %q", c.Service(), c.User())
	}
	if got := c.NotApplied(); !reflect.DeepEqual(got, []string{"containerEnv", "overrideCommand"}) {
		t.Fatalf("NotApplied = %q", got)
	}
	gen, err := c.Generate([]string{"/run/b/compose/0.yaml", "/run/b/compose/1.yaml", "/run/b/compose/facade.yaml"}, "/workspaces/task", "1000:1000")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(gen, &got); err != nil {
		t.Fatalf("the generated config is not JSON: %v\n%s", err, gen)
	}
	want := map[string]any{
		"name":                "app // not a comment",
		"dockerComposeFile":   []any{"/run/b/compose/0.yaml", "/run/b/compose/1.yaml", "/run/b/compose/facade.yaml"},
		"service":             "app",
		"runServices":         []any{"app"},
		"workspaceFolder":     "/workspaces/task", // the launch's, never the source's
		"remoteUser":          "1000:1000",        // the consumer, never the source's name
		"containerUser":       "1000:1000",
		"privileged":          false,
		"updateRemoteUserUID": false,
		"postCreateCommand":   "make deps",
		"customizations":      map[string]any{"vscode": map[string]any{"extensions": []any{"golang.go"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("generated:\n%s", gen)
	}
	if _, err := c.Generate(nil, "/workspaces/task", "1000:1000"); err == nil {
		t.Fatal("a config with no Compose file")
	}
	if _, err := c.Generate([]string{"/run/b/compose/0.yaml"}, "/workspaces/task", ""); err == nil {
		t.Fatal("a config with no user")
	}
}

func TestParseRefuses(t *testing.T) {
	// Every refusal names the file, then the key path.
	const at = "devcontainer: " + cfgPath + ": "
	for _, tc := range []struct{ name, config, want string }{
		{"image based", `{"image": "debian", "service": "app"}`, at + `image: a managed launch runs Compose services only`},
		{"dockerfile based", `{"dockerFile": "Dockerfile", "service": "app"}`, at + `dockerFile: a managed`},
		{"build", `{"build": {"dockerfile": "D"}, "service": "app"}`, at + `build: a managed`},
		{"initializeCommand", `{"service": "app", "initializeCommand": "curl x | sh"}`, at + `initializeCommand: runs on the host`},
		{"localEnv in a value", `{"service": "app", "containerEnv": {"A": "${localEnv:HOME}"}}`, at + `containerEnv.A: ${localEnv:...}`},
		{"localEnv in a list", `{"service": "app", "postStartCommand": ["echo", "${localEnv:TOKEN}"]}`, at + `postStartCommand[1]: `},
		{"localEnv in a key", `{"service": "app", "x": {"${localEnv:K}": 1}}`, at + `x.${localEnv:K}: `},
		// The CLI substitutes ${env:NAME} as ${localEnv:NAME}.
		{"env in a lifecycle command", `{"service": "app", "postCreateCommand": "echo ${env:HOME} > leak"}`, at + `postCreateCommand: ${env:...} reads the host's environment`},
		{"env escaped in JSON", `{"service": "app", "name": "\u0024{env:PATH}"}`, at + `name: ${env:...}`},
		{"no service", `{"dockerComposeFile": "compose.yaml"}`, at + `service: names no Compose service`},
		{"not an object", `["service"]`, at + `json: cannot unmarshal array`},
		{"data after", `{"service": "app"} {}`, at + `data after the config`},
		{"an unclosed comment", `{"service": "app"} /* x`, at + `a comment is not closed`},
		{"an unclosed string", `{"service": "app}`, at + `a string is not closed`},
		{"one byte over the limit", `{"service": "app"}` + strings.Repeat(" ", devcontainer.MaxConfigBytes-17), at + "the config is over 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := devcontainer.Parse(cfgPath, []byte(tc.config)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want an error with %q", err, tc.want)
			}
		})
	}
	// At the limit it is read.
	atLimit := `{"service": "app"}` + strings.Repeat(" ", devcontainer.MaxConfigBytes-18)
	if _, err := devcontainer.Parse(cfgPath, []byte(atLimit)); err != nil {
		t.Fatalf("a config of exactly %d bytes: %v", devcontainer.MaxConfigBytes, err)
	}
}

// TestParseRefusalKeyPathsArePrintable: the key path of a refusal is
// made of the repository's keys, and the message goes to the operator's
// terminal and into the launch record. A key that is not plain printable
// ASCII is quoted with every control, format and non-ASCII character
// escaped, and cut short, as Compose refusals show theirs.
func TestParseRefusalKeyPathsArePrintable(t *testing.T) {
	const at = "devcontainer: " + cfgPath + ": "
	long := strings.Repeat("k", 100)
	for _, tc := range []struct{ name, config, want string }{
		{"OSC 52 in a key", `{"service": "app", "x\u001b]52;c;SGVsbG8=\u0007": "${localEnv:A}"}`, at + `"x\x1b]52;c;SGVsbG8=\a": ${localEnv:...}`},
		{"CSI in a nested key", `{"service": "app", "a": {"\u001b[2J\u001b[H": {"b": "${env:A}"}}}`, at + `a."\x1b[2J\x1b[H".b: ${env:...}`},
		{"a line break in a key", `{"service": "app", "a\nbranchbox: ok": "${localEnv:A}"}`, at + `"a\nbranchbox: ok": `},
		{"C1 CSI in a key", `{"service": "app", "\u009b31m": "${localEnv:A}"}`, at + `"\u009b31m": `},
		{"bidi override in a key", `{"service": "app", "\u202egnp.exe": "${localEnv:A}"}`, at + `"\u202egnp.exe": `},
		{"the matched key itself", `{"service": "app", "x": {"\u001b${localEnv:K}": 1}}`, at + `x."\x1b${localEnv:K}": `},
		{"a long key", `{"service": "app", "` + long + `": "${localEnv:A}"}`, at + `"` + long[:64] + `...": `},
		{"an empty key", `{"service": "app", "": "${localEnv:A}"}`, at + `"": `},
		{"a plain key as it is", `{"service": "app", "containerEnv": {"A_1.b-c": "${localEnv:A}"}}`, at + `containerEnv.A_1.b-c: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := devcontainer.Parse(cfgPath, []byte(tc.config))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want an error with %q", err, tc.want)
			}
			for _, r := range err.Error() {
				if r < ' ' || r > '~' {
					t.Fatalf("Parse = %q: holds %U", err, r)
				}
			}
		})
	}
}

func TestComposeFilesShapes(t *testing.T) {
	for _, tc := range []struct {
		config string
		files  []string
		set    bool
		bad    bool
	}{
		{`{"service": "a"}`, nil, false, false},
		{`{"service": "a", "dockerComposeFile": "c.yaml"}`, []string{"c.yaml"}, true, false},
		{`{"service": "a", "dockerComposeFile": []}`, nil, true, false},
		{`{"service": "a", "dockerComposeFile": [1]}`, nil, true, true},
		{`{"service": "a", "dockerComposeFile": {"x": 1}}`, nil, true, true},
	} {
		c, err := devcontainer.Parse(cfgPath, []byte(tc.config))
		if err != nil {
			t.Fatal(err)
		}
		files, set, err := c.ComposeFiles()
		if tc.bad && (err == nil || !strings.HasPrefix(err.Error(), "devcontainer: "+cfgPath+": dockerComposeFile")) {
			t.Errorf("%s: %v, want a refusal naming the file and dockerComposeFile", tc.config, err)
		}
		if (err != nil) != tc.bad || set != tc.set || !reflect.DeepEqual(files, tc.files) {
			t.Errorf("%s: %q %v %v", tc.config, files, set, err)
		}
	}
}

// FuzzParse: a config never panics the reader, and JSON without comments
// or trailing commas passes StripJSONC unchanged.
func FuzzParse(f *testing.F) {
	f.Add([]byte(source))
	f.Add([]byte(`{"service": "a", "x": "/* no */", "y": [1,],}`))
	f.Add([]byte(`{"a":"\"//"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		devcontainer.Parse(cfgPath, data)
		if json.Valid(data) && !bytes.Contains(data, []byte("/")) {
			out, err := devcontainer.StripJSONC(data)
			if err != nil || !bytes.Equal(out, data) {
				t.Fatalf("valid JSON changed: %q -> %q %v", data, out, err)
			}
		}
	})
}
