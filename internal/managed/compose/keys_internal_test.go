package compose

import "testing"

// TestEveryReplacedKeyHasANotice: a key the facade replaces is never
// announced without saying what runs instead.
func TestEveryReplacedKeyHasANotice(t *testing.T) {
	for key, use := range serviceKeys {
		if (use == keyReplaced || use == keyKeptButPrimary) && replacedWhy[key] == "" {
			t.Errorf("key %q is replaced but has no notice", key)
		}
	}
}
