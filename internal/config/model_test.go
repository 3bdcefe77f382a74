package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestParseBrokerModel: `model` names the upstream, where the key is, and
// the hourly output bound; absent, the default upstream and no key.
func TestParseBrokerModel(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       Model
	}{
		{"absent", "limits: {}\n", Model{Upstream: DefaultModelUpstream}},
		{"null", "model:\n", Model{Upstream: DefaultModelUpstream}},
		{"key file", "model: {api_key_file: ~/.config/jailbee/anthropic-key}\n",
			Model{Upstream: DefaultModelUpstream, APIKeyFile: "~/.config/jailbee/anthropic-key"}},
		{"key env and upstream", "model: {upstream: \"http://127.0.0.1:8080/\", api_key_env: ANTHROPIC_API_KEY}\n",
			Model{Upstream: "http://127.0.0.1:8080", APIKeyEnv: "ANTHROPIC_API_KEY"}},
		{"path prefix", "model: {upstream: https://gw.example/anthropic, api_key_file: /etc/k}\n",
			Model{Upstream: "https://gw.example/anthropic", APIKeyFile: "/etc/k"}},
		{"budget at min", "model: {max_output_tokens_per_hour: 1}\n",
			Model{Upstream: DefaultModelUpstream, MaxOutputTokensPerHour: MinOutputTokensPerHour}},
		{"litellm profiles", "model: {litellm: {grok: {upstream: \"http://127.0.0.1:4000/\", api_key_env: LITELLM_KEY}, " + strings.Repeat("g", MaxLiteLLMProfileName) + ": {upstream: https://h, api_key_file: /k}}}\n",
			Model{Upstream: DefaultModelUpstream, LiteLLM: map[string]ModelEndpoint{
				"grok": {Upstream: "http://127.0.0.1:4000", APIKeyEnv: "LITELLM_KEY"},
				strings.Repeat("g", MaxLiteLLMProfileName): {Upstream: "https://h", APIKeyFile: "/k"}}}},
		{"budget at max", fmt.Sprintf("model: {max_output_tokens_per_hour: %d}\n", MaxOutputTokensPerHour),
			Model{Upstream: DefaultModelUpstream, MaxOutputTokensPerHour: MaxOutputTokensPerHour}},
		{"input budget at min", "model: {max_input_tokens_per_hour: 1}\n",
			Model{Upstream: DefaultModelUpstream, MaxInputTokensPerHour: MinInputTokensPerHour}},
		{"input budget at max", fmt.Sprintf("model: {max_input_tokens_per_hour: %d, max_output_tokens_per_hour: 5}\n", MaxInputTokensPerHour),
			Model{Upstream: DefaultModelUpstream, MaxInputTokensPerHour: MaxInputTokensPerHour, MaxOutputTokensPerHour: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ParseBroker([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(b.Model, tc.want) {
				t.Fatalf("got %+v, want %+v", b.Model, tc.want)
			}
		})
	}
}

func TestParseBrokerModelRefused(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"not a mapping", "model: anthropic\n", "model: must be a mapping (line 1)"},
		{"unknown key", "model: {api_key: sk-ant-x}\n", "model.api_key: unknown key (line 1)"},
		{"both keys", "model: {api_key_file: /k, api_key_env: K}\n", "model: set api_key_file or api_key_env, not both (line 1)"},
		{"relative key file", "model: {api_key_file: key}\n", "model.api_key_file: must be an absolute path or start with ~/ (line 1)"},
		{"env name", "model: {api_key_env: \"A-B\"}\n", "model.api_key_env: must be an environment variable's name (letters, digits, _) (line 1)"},
		{"upstream scheme", "model: {upstream: \"ftp://x\"}\n", "model.upstream: must be an http or https URL such as https://api.anthropic.com (line 1)"},
		{"upstream no host", "model: {upstream: \"https:///v1\"}\n", "model.upstream: must be an http or https URL such as https://api.anthropic.com (line 1)"},
		{"upstream credentials", "model: {upstream: \"https://u:p@h\"}\n", "model.upstream: must not hold credentials (the key goes in api_key_file or api_key_env) (line 1)"},
		{"upstream query", "model: {upstream: \"https://h/?k=1\"}\n", "model.upstream: must not have a query or fragment (line 1)"},
		{"upstream number", "model: {upstream: 8080}\n", "model.upstream: must be a string (line 1)"},
		{"provider tools not a bool", "model: {provider_tools: yes}\n", "model.provider_tools: must be true or false (line 1)"},
		{"provider tools a string", "model: {provider_tools: \"true\"}\n", "model.provider_tools: must be true or false (line 1)"},
		{"budget zero", "model: {max_output_tokens_per_hour: 0}\n", fmt.Sprintf("model.max_output_tokens_per_hour: must be 1 to %d (line 1)", MaxOutputTokensPerHour)},
		{"litellm not a mapping", "model: {litellm: [grok]}\n", "model.litellm: must be a mapping (line 1)"},
		{"litellm bad name", "model: {litellm: {Grok: {upstream: http://h, api_key_env: K}}}\n", "model.litellm.Grok: a profile name is [a-z0-9][a-z0-9_-], at most 32 characters (line 1)"},
		{"litellm name past max", "model: {litellm: {" + strings.Repeat("g", MaxLiteLLMProfileName+1) + ": {upstream: http://h, api_key_env: K}}}\n",
			"model.litellm." + strings.Repeat("g", MaxLiteLLMProfileName+1) + ": a profile name is [a-z0-9][a-z0-9_-], at most 32 characters (line 1)"},
		{"litellm no upstream", "model: {litellm: {grok: {api_key_env: K}}}\n", "model.litellm.grok: needs an upstream (line 1)"},
		{"litellm no key", "model: {litellm: {grok: {upstream: http://h}}}\n", "model.litellm.grok: needs api_key_file or api_key_env (one of the two) (line 1)"},
		{"litellm two keys", "model: {litellm: {grok: {upstream: http://h, api_key_env: K, api_key_file: /k}}}\n", "model.litellm.grok: needs api_key_file or api_key_env (one of the two) (line 1)"},
		{"litellm unknown key", "model: {litellm: {grok: {upstream: http://h, api_key_env: K, tiers: {}}}}\n", "model.litellm.grok.tiers: unknown key (line 1)"},
		{"litellm bad upstream", "model: {litellm: {grok: {upstream: \"ftp://h\", api_key_env: K}}}\n", "model.litellm.grok.upstream: must be an http or https URL such as https://api.anthropic.com (line 1)"},
		{"input budget zero", "model: {max_input_tokens_per_hour: 0}\n", fmt.Sprintf("model.max_input_tokens_per_hour: must be 1 to %d (line 1)", MaxInputTokensPerHour)},
		{"input budget past max", fmt.Sprintf("model: {max_input_tokens_per_hour: %d}\n", MaxInputTokensPerHour+1), fmt.Sprintf("model.max_input_tokens_per_hour: must be 1 to %d (line 1)", MaxInputTokensPerHour)},
		{"budget past max", fmt.Sprintf("model: {max_output_tokens_per_hour: %d}\n", MaxOutputTokensPerHour+1), fmt.Sprintf("model.max_output_tokens_per_hour: must be 1 to %d (line 1)", MaxOutputTokensPerHour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := brokerError(t, tc.yaml); got != tc.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}
