package assignment

import (
	"strconv"
	"strings"
)

// Environment names bound by leases: the inherited names of a model
// identity and the environment_name of a provider-environment
// materialization.
//
// Syntax: [A-Z_][A-Z0-9_]*, at most MaxEnvNameBytes. Refused categories,
// each reported by name:
//
//   - shell: variables a shell or the process start-up reads as code or as
//     its own state (BASH_ENV, ENV, PROMPT_COMMAND, IFS, PATH, HOME, ...);
//   - loader: dynamic-loader and interpreter start-up hooks (LD_*, DYLD_*,
//     NODE_OPTIONS, PYTHONPATH, PERL5OPT, RUBYOPT, JAVA_TOOL_OPTIONS, ...);
//   - Git control: every GIT_* name (GIT_DIR, GIT_SSH_COMMAND,
//     GIT_CONFIG_*, ...), a stricter rule than the reference's list: a
//     prefix cannot miss a control variable a later Git adds;
//   - container supervisor: DOCKER_*, CONTAINERD_*, CONTAINER_HOST,
//     COMPOSE_*, DEVCONTAINER_*, BUILDKIT_*, PODMAN_*, KUBECONFIG and the
//     SSH agent socket;
//   - BranchBox control: BRANCHBOX_*.

var reservedExact = map[string]string{
	// shell
	"_": "shell", "BASH_ENV": "shell", "BASHOPTS": "shell", "CDPATH": "shell",
	"ENV": "shell", "FPATH": "shell", "GLOBIGNORE": "shell", "HISTFILE": "shell",
	"HOME": "shell", "HOSTNAME": "shell", "IFS": "shell", "LOGNAME": "shell",
	"MAIL": "shell", "OLDPWD": "shell", "PATH": "shell", "PROMPT_COMMAND": "shell",
	"PS1": "shell", "PS2": "shell", "PS4": "shell", "PWD": "shell", "SHELL": "shell",
	"SHELLOPTS": "shell", "SHLVL": "shell", "USER": "shell", "ZDOTDIR": "shell",
	// loader and interpreter start-up
	"NODE_OPTIONS": "loader", "NODE_PATH": "loader", "PYTHONPATH": "loader",
	"PYTHONSTARTUP": "loader", "PYTHONHOME": "loader", "PERL5LIB": "loader",
	"PERL5OPT": "loader", "PERLLIB": "loader", "RUBYOPT": "loader", "RUBYLIB": "loader",
	"JAVA_TOOL_OPTIONS": "loader", "_JAVA_OPTIONS": "loader", "JDK_JAVA_OPTIONS": "loader",
	"GCONV_PATH": "loader", "MALLOC_CHECK_": "loader",
	// container supervisor and ambient authority
	"CONTAINER_HOST": "container-supervisor", "KUBECONFIG": "container-supervisor",
	"SSH_AUTH_SOCK": "container-supervisor", "SSH_ASKPASS": "container-supervisor",
}

var reservedPrefixes = []struct{ prefix, category string }{
	{"LD_", "loader"},
	{"DYLD_", "loader"},
	{"GIT_", "git-control"},
	{"DOCKER_", "container-supervisor"},
	{"CONTAINERD_", "container-supervisor"},
	{"COMPOSE_", "container-supervisor"},
	{"DEVCONTAINER_", "container-supervisor"},
	{"BUILDKIT_", "container-supervisor"},
	{"PODMAN_", "container-supervisor"},
	{"BRANCHBOX_", "branchbox-control"},
}

// EnvironmentNameReason returns why name may not be bound by a lease, or
// "" when it may. The reason names the refused category, never the name.
func EnvironmentNameReason(name string) string {
	if name == "" || len(name) > MaxEnvNameBytes {
		return "environment names must be 1-" + strconv.Itoa(MaxEnvNameBytes) + " characters"
	}
	c := name[0]
	if c != '_' && (c < 'A' || c > 'Z') {
		return "environment names must match [A-Z_][A-Z0-9_]*"
	}
	for i := 1; i < len(name); i++ {
		c := name[i]
		if c != '_' && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return "environment names must match [A-Z_][A-Z0-9_]*"
		}
	}
	if cat := ReservedEnvironmentCategory(name); cat != "" {
		return "the name is reserved (" + cat + " variable)"
	}
	return ""
}

// ReservedEnvironmentCategory returns the refused category of name
// ("shell", "loader", "git-control", "container-supervisor",
// "branchbox-control"), or "" when the name is not reserved.
func ReservedEnvironmentCategory(name string) string {
	if cat, ok := reservedExact[name]; ok {
		return cat
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(name, p.prefix) {
			return p.category
		}
	}
	return ""
}
