package endpoint

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

func TestParseRef(t *testing.T) {
	long := strings.Repeat("a", 253)
	tests := []struct {
		name    string
		in      string
		want    Ref
		wantErr bool
	}{
		{name: "zero", in: "0", want: Ref{Kind: RefID, ID: 0}},
		{name: "one", in: "1", want: Ref{Kind: RefID, ID: 1}},
		{name: "max", in: "65535", want: Ref{Kind: RefID, ID: 65535}},
		{name: "leading zeros", in: "007", want: Ref{Kind: RefID, ID: 7}},
		{name: "container", in: "container-id:abc", want: Ref{Kind: RefContainerID, ContainerID: "abc"}},
		{name: "container with colon", in: "container-id:a:b", want: Ref{Kind: RefContainerID, ContainerID: "a:b"}},
		{name: "container 253", in: "container-id:" + long, want: Ref{Kind: RefContainerID, ContainerID: long}},
		{name: "pod", in: "pod-name:ns/pod", want: Ref{Kind: RefPodName, Namespace: "ns", PodName: "pod"}},
		{name: "attachment", in: "cni-attachment-id:abc:eth0", want: Ref{Kind: RefAttachment, ContainerID: "abc", IfName: "eth0"}},
		{name: "attachment colon in container", in: "cni-attachment-id:a:b:net1", want: Ref{Kind: RefAttachment, ContainerID: "a:b", IfName: "net1"}},
		{name: "pod long", in: "pod-name:" + long + "/" + long, want: Ref{Kind: RefPodName, Namespace: long, PodName: long}},

		{name: "empty", in: "", wantErr: true},
		{name: "negative", in: "-1", wantErr: true},
		{name: "too big", in: "65536", wantErr: true},
		{name: "way too big", in: "99999999999999999999", wantErr: true},
		{name: "plus", in: "+5", wantErr: true},
		{name: "hex", in: "0x10", wantErr: true},
		{name: "underscore", in: "1_000", wantErr: true},
		{name: "space", in: " 5", wantErr: true},
		{name: "word", in: "abc", wantErr: true},
		{name: "container empty", in: "container-id:", wantErr: true},
		{name: "container slash", in: "container-id:a/b", wantErr: true},
		{name: "container space", in: "container-id:a b", wantErr: true},
		{name: "container percent", in: "container-id:a%2F", wantErr: true},
		{name: "container control", in: "container-id:a\x00", wantErr: true},
		{name: "container 254", in: "container-id:" + long + "a", wantErr: true},
		{name: "pod no slash", in: "pod-name:ns", wantErr: true},
		{name: "attachment no interface", in: "cni-attachment-id:abc", wantErr: true},
		{name: "attachment empty interface", in: "cni-attachment-id:abc:", wantErr: true},
		{name: "attachment empty container", in: "cni-attachment-id::eth0", wantErr: true},
		{name: "attachment interface dotdot", in: "cni-attachment-id:abc:..", wantErr: true},
		{name: "attachment interface too long", in: "cni-attachment-id:abc:eth0123456789abc", wantErr: true},
		{name: "pod no namespace", in: "pod-name:/pod", wantErr: true},
		{name: "pod no name", in: "pod-name:ns/", wantErr: true},
		{name: "pod two slashes", in: "pod-name:ns/pod/x", wantErr: true},
		{name: "pod empty", in: "pod-name:", wantErr: true},
		{name: "unknown prefix", in: "unknown:x", wantErr: true},
		{name: "empty prefix", in: ":x", wantErr: true},
		{name: "very long", in: strings.Repeat("1", 10000), wantErr: true},
		{name: "very long container", in: "container-id:" + strings.Repeat("a", 700), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRef(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidID) {
					t.Fatalf("ParseRef(%q) = %+v, %v; want ErrInvalidID", tt.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRef(%q) error = %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("ParseRef(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			again, err := ParseRef(got.String())
			if err != nil || again != got {
				t.Fatalf("ParseRef(%q.String() = %q) = %+v, %v; want %+v", tt.in, got.String(), again, err, got)
			}
		})
	}
}

// TestParseRefEveryID checks every number 0..65535 and its String form.
func TestParseRefEveryID(t *testing.T) {
	for n := 0; n <= MaxID; n++ {
		s := strconv.Itoa(n)
		ref, err := ParseRef(s)
		if err != nil || ref.Kind != RefID || ref.ID != ID(n) {
			t.Fatalf("ParseRef(%q) = %+v, %v", s, ref, err)
		}
		if ref.String() != s {
			t.Fatalf("Ref{ID: %d}.String() = %q", n, ref.String())
		}
	}
}

func TestRefString(t *testing.T) {
	tests := []struct {
		ref  Ref
		want string
	}{
		{Ref{Kind: RefID, ID: 42}, "42"},
		{Ref{Kind: RefContainerID, ContainerID: "abc"}, "container-id:abc"},
		{Ref{Kind: RefPodName, Namespace: "ns", PodName: "p"}, "pod-name:ns/p"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.ref.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"0", "42", "65535", "65536", "-1", "+5", "container-id:abc", "container-id:",
		"pod-name:ns/pod", "pod-name:ns", "pod-name:/pod", "unknown:x", "container-id:a:b", "pod-name:a/b/c",
		"container-id:\xff", strings.Repeat("9", 700), "cni-attachment-id:a:eth0", "cni-attachment-id:a:b:c", "cni-attachment-id:a:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref, err := ParseRef(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidID) {
				t.Fatalf("ParseRef(%q) error %v does not wrap ErrInvalidID", s, err)
			}
			return
		}
		switch ref.Kind {
		case RefID:
			if ref.ContainerID != "" || ref.Namespace != "" || ref.PodName != "" {
				t.Fatalf("ParseRef(%q) = %+v: numeric ref with names", s, ref)
			}
		case RefContainerID:
			if ref.ContainerID == "" || strings.Contains(ref.ContainerID, "/") {
				t.Fatalf("ParseRef(%q) = %+v: bad container id", s, ref)
			}
		case RefAttachment:
			if ref.ContainerID == "" || strings.Contains(ref.ContainerID, "/") || !ifname.Valid(ref.IfName) {
				t.Fatalf("ParseRef(%q) = %+v: bad attachment", s, ref)
			}
		case RefPodName:
			if ref.Namespace == "" || ref.PodName == "" || strings.Contains(ref.PodName, "/") {
				t.Fatalf("ParseRef(%q) = %+v: bad pod", s, ref)
			}
		default:
			t.Fatalf("ParseRef(%q) = %+v: unknown kind", s, ref)
		}
		str := ref.String()
		again, err := ParseRef(str)
		if err != nil {
			t.Fatalf("ParseRef(%q) = %+v, but ParseRef(String() = %q) fails: %v", s, ref, str, err)
		}
		if again != ref {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v", s, ref, str, again)
		}
		if again.String() != str {
			t.Fatalf("String not stable: %q -> %q", str, again.String())
		}
	})
}
