package assignment

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Content rules for file materializations: pure checks on the bytes that
// package leasecheck read. Reasons never quote the bytes.

// FileSizeBounds returns the inclusive size bounds of a file
// materialization of the scope.
func FileSizeBounds(s Scope) (min, max int64) {
	switch s {
	case ScopeProviderEnvironment:
		return MinProviderValueBytes, MaxProviderValueBytes
	case ScopeToolRequest:
		return MinCapabilityBytes, MaxCapabilityBytes
	case ScopeProjectEnvironment:
		return 1, MaxProjectEnvironmentBytes
	default: // provider-credential
		return 1, MaxProviderCredentialBytes
	}
}

// CheckFileContent applies the scope's content rule to a file
// materialization's bytes (its size bounds included).
func CheckFileContent(s Scope, b []byte) error {
	min, max := FileSizeBounds(s)
	if int64(len(b)) < min || int64(len(b)) > max {
		return Errorf("", "file must hold %d-%d bytes", min, max)
	}
	switch s {
	case ScopeProviderEnvironment:
		return ProviderValueError(b)
	case ScopeToolRequest:
		return CapabilityError(b)
	case ScopeProjectEnvironment:
		return ProjectEnvironmentError(b)
	}
	return nil
}

// ProviderValueError checks a provider-environment value: 8 B - 16 KiB of
// UTF-8 with no control character at all (so no trailing newline either;
// C1 controls included, a stricter reading than the reference's ASCII-only
// check).
func ProviderValueError(b []byte) error {
	if len(b) < MinProviderValueBytes || len(b) > MaxProviderValueBytes {
		return Errorf("", "value must hold %d-%d bytes", MinProviderValueBytes, MaxProviderValueBytes)
	}
	if !utf8.Valid(b) {
		return Errorf("", "value is not valid UTF-8")
	}
	if i := strings.IndexFunc(string(b), unicode.IsControl); i >= 0 {
		return Errorf("", "value holds a control character (byte %d); a trailing newline counts", i)
	}
	return nil
}

// CapabilityError checks a tool-request capability: 32-128 bytes of
// [A-Za-z0-9._-].
func CapabilityError(b []byte) error {
	if len(b) < MinCapabilityBytes || len(b) > MaxCapabilityBytes {
		return Errorf("", "capability must hold %d-%d bytes", MinCapabilityBytes, MaxCapabilityBytes)
	}
	for _, c := range b {
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return Errorf("", "capability may only use A-Z, a-z, 0-9, '.', '_' and '-'")
		}
	}
	return nil
}

// ProjectEnvironmentError checks the project-environment dotenv file:
// UTF-8, LF-terminated canonical KEY=value lines (no comments, blanks, CR or
// NUL), 1-256 entries sorted strictly by name, names in environment syntax
// and not reserved (the environment-name rule plus the credentials a
// project file must never carry), values at most 16 KiB without control
// characters.
func ProjectEnvironmentError(b []byte) error {
	if len(b) == 0 || len(b) > MaxProjectEnvironmentBytes {
		return Errorf("", "project environment must hold 1-%d bytes", MaxProjectEnvironmentBytes)
	}
	if !utf8.Valid(b) {
		return Errorf("", "project environment is not valid UTF-8")
	}
	s := string(b)
	if !strings.HasSuffix(s, "\n") || strings.ContainsAny(s, "\r\x00") {
		return Errorf("", "project environment must be LF-terminated lines without CR or NUL")
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) > MaxProjectEnvironmentEntries {
		return Errorf("", "project environment holds more than %d entries", MaxProjectEnvironmentEntries)
	}
	prev := ""
	for i, line := range lines {
		name, value, ok := strings.Cut(line, "=")
		if !ok || line == "" || strings.HasPrefix(line, "#") {
			return Errorf("", "line %d is not a KEY=value line", i+1)
		}
		if r := EnvironmentNameReason(name); r != "" {
			return Errorf("", "line %d: %s", i+1, r)
		}
		if projectReserved[name] || strings.HasPrefix(name, "CODEX_") {
			return Errorf("", "line %d: the name is reserved for provider credentials", i+1)
		}
		if i > 0 && name <= prev {
			return Errorf("", "line %d: names must be unique and sorted", i+1)
		}
		if len(value) > MaxProjectEnvironmentValueBytes || strings.IndexFunc(value, unicode.IsControl) >= 0 {
			return Errorf("", "line %d: value exceeds %d bytes or holds a control character", i+1, MaxProjectEnvironmentValueBytes)
		}
		prev = name
	}
	return nil
}

// projectReserved lists credentials that belong in a provider-environment
// lease, never in the project file every container process can read
// (reference list).
var projectReserved = map[string]bool{
	"AGENTIFY_PROJECT_ENVIRONMENT_BUNDLE": true, "ANTHROPIC_API_KEY": true,
	"AZURE_OPENAI_API_KEY": true, "CLOUDFLARE_API_TOKEN": true,
	"CLOUDFLARE_TUNNEL_TOKEN": true, "DEV_HOSTNAME": true, "GITHUB_TOKEN": true,
	"GH_TOKEN": true, "GEMINI_API_KEY": true, "GOOGLE_API_KEY": true,
	"GROQ_API_KEY": true, "OPENAI_API_KEY": true, "OP_SERVICE_ACCOUNT_TOKEN": true,
	"TUNNEL_TOKEN": true,
}
