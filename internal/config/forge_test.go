package config

import (
	"reflect"
	"testing"
)

var defaultForge = Forge{APIURL: DefaultForgeAPIURL, GitURL: DefaultForgeGitURL}

// TestParseBrokerForge: `forge` names the API, the git remote template and
// where the token is; absent, GitHub and no token.
func TestParseBrokerForge(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       Forge
	}{
		{"absent", "limits: {}\n", defaultForge},
		{"null", "forge:\n", defaultForge},
		{"token file", "forge: {token_file: ~/.config/jailbee/github-token}\n",
			Forge{APIURL: DefaultForgeAPIURL, GitURL: DefaultForgeGitURL, TokenFile: "~/.config/jailbee/github-token"}},
		{"token env", "forge: {token_env: GH_TOKEN}\n", Forge{APIURL: DefaultForgeAPIURL, GitURL: DefaultForgeGitURL, TokenEnv: "GH_TOKEN"}},
		{"enterprise", "forge: {api_url: \"https://ghe.example/api/v3\", git_url: \"https://ghe.example/{owner}/{name}.git\", token_file: /etc/t}\n",
			Forge{APIURL: "https://ghe.example/api/v3/", GitURL: "https://ghe.example/{owner}/{name}.git", TokenFile: "/etc/t"}},
		{"local", "forge: {api_url: \"http://127.0.0.1:9/\", git_url: \"file:///srv/{owner}/{name}\"}\n",
			Forge{APIURL: "http://127.0.0.1:9/", GitURL: "file:///srv/{owner}/{name}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ParseBroker([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(b.Forge, tc.want) {
				t.Fatalf("got %+v, want %+v", b.Forge, tc.want)
			}
			if b.Forge.HasToken() != (tc.want.TokenFile != "" || tc.want.TokenEnv != "") {
				t.Fatalf("HasToken = %v", b.Forge.HasToken())
			}
		})
	}
}

func TestParseBrokerForgeRefused(t *testing.T) {
	const gitWant = "must be an https, http or file URL naming {owner} and {name}, such as https://github.com/{owner}/{name}.git (line 1)"
	for _, tc := range []struct{ name, yaml, want string }{
		{"not a mapping", "forge: github\n", "forge: must be a mapping (line 1)"},
		{"unknown key", "forge: {token: ghp_x}\n", "forge.token: unknown key (line 1)"},
		{"both tokens", "forge: {token_file: /t, token_env: T}\n", "forge: set token_file or token_env, not both (line 1)"},
		{"relative token file", "forge: {token_file: token}\n", "forge.token_file: must be an absolute path or start with ~/ (line 1)"},
		{"env name", "forge: {token_env: \"GH-TOKEN\"}\n", "forge.token_env: must be an environment variable's name (letters, digits, _) (line 1)"},
		{"api scheme", "forge: {api_url: \"ftp://h\"}\n", "forge.api_url: must be an http or https URL such as https://api.github.com/ (line 1)"},
		{"api credentials", "forge: {api_url: \"https://u:p@h\"}\n", "forge.api_url: must not hold credentials (the token goes in token_file or token_env) (line 1)"},
		{"api query", "forge: {api_url: \"https://h/?x=1\"}\n", "forge.api_url: must not have a query or fragment (line 1)"},
		{"api number", "forge: {api_url: 1}\n", "forge.api_url: must be a string (line 1)"},
		{"git no name", "forge: {git_url: \"https://github.com/{owner}/x.git\"}\n", "forge.git_url: " + gitWant},
		{"git other brace", "forge: {git_url: \"https://github.com/{owner}/{name}/{branch}\"}\n", "forge.git_url: " + gitWant},
		{"git ssh", "forge: {git_url: \"ssh://git@github.com/{owner}/{name}.git\"}\n", "forge.git_url: " + gitWant},
		{"git scp", "forge: {git_url: \"git@github.com:{owner}/{name}.git\"}\n", "forge.git_url: " + gitWant},
		{"git ext", "forge: {git_url: \"ext::sh {owner} {name}\"}\n", "forge.git_url: " + gitWant},
		{"git file host", "forge: {git_url: \"file://host/{owner}/{name}\"}\n", "forge.git_url: " + gitWant},
		{"git space", "forge: {git_url: \"https://h/{owner}/{name} x\"}\n", "forge.git_url: " + gitWant},
		{"git credentials", "forge: {git_url: \"https://x-access-token:t@github.com/{owner}/{name}.git\"}\n",
			"forge.git_url: must not hold credentials (the token goes in token_file or token_env) (line 1)"},
		{"git query", "forge: {git_url: \"https://github.com/{owner}/{name}.git?x\"}\n", "forge.git_url: must not have a query or fragment (line 1)"},
		{"publish unknown", "publish: {actions: 3}\n", "publish.actions: unknown key (line 1)"},
		{"publish zero", "publish: {actions_per_hour: 0}\n", "publish.actions_per_hour: must be 1 to 10000 (line 1)"},
		{"publish past max", "publish: {actions_per_hour: 10001}\n", "publish.actions_per_hour: must be 1 to 10000 (line 1)"},
		{"publish string", "publish: {actions_per_hour: many}\n", "publish.actions_per_hour: must be an integer (line 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := brokerError(t, tc.yaml); got != tc.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

func TestParseBrokerPublish(t *testing.T) {
	for yaml, want := range map[string]int{
		"":                                     DefaultPublishActionsPerHour,
		"publish:\n":                           DefaultPublishActionsPerHour,
		"publish: {actions_per_hour: 1}\n":     1,
		"publish: {actions_per_hour: 10000}\n": 10000,
	} {
		b, err := ParseBroker([]byte(yaml))
		if err != nil {
			t.Fatalf("%q: %v", yaml, err)
		}
		if b.Publish.ActionsPerHour != want {
			t.Fatalf("%q: actions_per_hour %d, want %d", yaml, b.Publish.ActionsPerHour, want)
		}
	}
}

// TestParseBrokerPublishBytes: publish.bytes_per_hour at its bounds, and
// one byte past each.
func TestParseBrokerPublishBytes(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want int64
		err  string
	}{
		{"", DefaultPublishBytesPerHour, ""},
		{"publish: {bytes_per_hour: 1MiB}\n", MinPublishBytesPerHour, ""},
		{"publish: {bytes_per_hour: 1TiB}\n", MaxPublishBytesPerHour, ""},
		{"publish: {bytes_per_hour: 1048575B}\n", 0, "publish.bytes_per_hour: must be 1MiB to 1TiB (line 1)"},
		{"publish: {bytes_per_hour: 1099511627777B}\n", 0, "publish.bytes_per_hour: must be 1MiB to 1TiB (line 1)"},
	} {
		b, err := ParseBroker([]byte(tc.yaml))
		switch {
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.yaml, err)
		case tc.err == "" && b.Publish.BytesPerHour != tc.want:
			t.Errorf("%q: bytes_per_hour %d, want %d", tc.yaml, b.Publish.BytesPerHour, tc.want)
		}
	}
}

func TestForgeValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(b *Broker)
		want string
	}{
		{"api URL without /", func(b *Broker) { b.Forge.APIURL = "https://api.github.com" }, "forge.api_url: must end in /"},
		{"empty git URL", func(b *Broker) { b.Forge.GitURL = "" }, "forge.git_url: must be an https, http or file URL naming {owner} and {name}, such as https://github.com/{owner}/{name}.git"},
		{"both tokens", func(b *Broker) { b.Forge.TokenFile, b.Forge.TokenEnv = "/t", "T" }, "forge: set token_file or token_env, not both"},
		{"bad env", func(b *Broker) { b.Forge.TokenEnv = "1X" }, "forge.token_env: must be an environment variable's name (letters, digits, _)"},
		{"publish 0", func(b *Broker) { b.Publish.ActionsPerHour = 0 }, "publish.actions_per_hour: must be 1 to 10000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := DefaultBroker()
			tc.edit(b)
			err := b.Validate()
			if err == nil || err.Error() != tc.want {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}
