package skel

import (
	"math/rand/v2"
	"reflect"
	"regexp"
	"testing"

	"github.com/containernetworking/cni/pkg/utils"
)

// upstream is pkg/utils' expression, which validName replaces.
var upstream = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// TestValidNameMatchesRegexp compares validName with the expression on
// fixed cases and on random strings over an alphabet holding every
// class boundary.
func TestValidNameMatchesRegexp(t *testing.T) {
	cases := []string{"", "a", "A", "0", "_", ".", "-", "a_", "a.", "a-", "_a", ".a", "-a", "a b", "a/b",
		"a:b", "abc123", "a\n", "a\x00", "é", "aé", "Z9_.-z", "a@b", "a[b", "a`", "a{", "a~"}
	alphabet := []byte("aAzZ09_.-/:@[`{ \t\n\x00\x7f\xc3\xa9/")
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		b := make([]byte, r.IntN(6))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		if got, want := validName(s), upstream.MatchString(s); got != want {
			t.Fatalf("validName(%q) = %v, the expression says %v", s, got, want)
		}
	}
}

// TestValidateMatchesUpstream compares the three checks with pkg/utils'.
func TestValidateMatchesUpstream(t *testing.T) {
	for _, s := range []string{"", "a", "abc-1.2_3", "-a", "a b", "0123456789abcdef", "0123456789abcde", ".", "..", "a/b", "a:b", "a\tb", "eth0", "é"} {
		if got, want := validateContainerID(s), utils.ValidateContainerID(s); !reflect.DeepEqual(got, want) {
			t.Errorf("validateContainerID(%q) = %v, upstream %v", s, got, want)
		}
		if got, want := validateNetworkName(s), utils.ValidateNetworkName(s); !reflect.DeepEqual(got, want) {
			t.Errorf("validateNetworkName(%q) = %v, upstream %v", s, got, want)
		}
		if got, want := validateInterfaceName(s), utils.ValidateInterfaceName(s); !reflect.DeepEqual(got, want) {
			t.Errorf("validateInterfaceName(%q) = %v, upstream %v", s, got, want)
		}
	}
}
