package ifname

import "testing"

func TestValid(t *testing.T) {
	for name, want := range map[string]bool{
		"eth0": true, "net1": true, "lxc0123456789ab": true, "a": true, "eth0.100": true,
		"": false, ".": false, "..": false, "all": false, "default": false,
		"sixteen-bytes-xx": false, "a/b": false, "eth0:1": false, "eth%d": false, "a b": false, "a\n": false, "é": false,
	} {
		if got := Valid(name); got != want {
			t.Errorf("Valid(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestValidHost(t *testing.T) {
	for name, want := range map[string]bool{
		"lxc0123456789ab": true, "lxctest0000001": true, "lxcb7": true,
		"lxc": false, "eth0": false, "lxc_health": false, "membrane_host": false, "lxc0123456789abc": false,
		"lxcABC": false, "lxc..": false, "lxc/../eth0": false, "xlxc01": false,
	} {
		if got := ValidHost(name); got != want {
			t.Errorf("ValidHost(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestManaged(t *testing.T) {
	for name, want := range map[string]bool{
		"lxc0123456789ab": true, "lxc_health": true, "lxc_other": false, "eth0": false, "membrane_host": false,
	} {
		if got := Managed(name); got != want {
			t.Errorf("Managed(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestTombstone(t *testing.T) {
	for _, index := range []int{1, 35, 36, 4096, 1<<31 - 1} {
		name := Tombstone(index)
		if !IsTombstone(name) || !Valid(name) || ValidHost(name) || Managed(name) {
			t.Errorf("Tombstone(%d) = %q: IsTombstone %v Valid %v ValidHost %v Managed %v", index, name,
				IsTombstone(name), Valid(name), ValidHost(name), Managed(name))
		}
	}
	for _, name := range []string{"lxc-", "lxc-A", "lxc-12345678", "lxc_health", "lxc0123456789ab", "eth0", "lxc-a/b"} {
		if IsTombstone(name) {
			t.Errorf("IsTombstone(%q) = true", name)
		}
	}
}

func TestIsTombstoneOf(t *testing.T) {
	for _, index := range []int{1, 35, 36, 4096, 1 << 30} {
		if !IsTombstoneOf(Tombstone(index), index) {
			t.Errorf("Tombstone(%d) not a tombstone of %d", index, index)
		}
		if IsTombstoneOf(Tombstone(index), index+1) {
			t.Errorf("Tombstone(%d) taken for a tombstone of %d", index, index+1)
		}
	}
	if IsTombstoneOf("lxc-", 0) || IsTombstoneOf("eth0", 0) {
		t.Error("a non-tombstone name taken for one")
	}
}
