package labels

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParse(t *testing.T) {
	long := strings.Repeat("a", maxLen)
	tests := []struct {
		name string
		in   string
		want Label
	}{
		{"source key value", "k8s:app=web", Label{"k8s", "app", "web"}},
		{"source key", "reserved:host", Label{"reserved", "host", ""}},
		{"dotted key", "k8s:io.kubernetes.pod.namespace=default", Label{"k8s", "io.kubernetes.pod.namespace", "default"}},
		{"colon in value is not a source", "app=a:b", Label{"unspec", "app", "a:b"}},
		{"key value", "app=web", Label{"unspec", "app", "web"}},
		{"bare key", "app", Label{"unspec", "app", ""}},
		{"empty value", "k8s:app=", Label{"k8s", "app", ""}},
		{"equals in value", "a=b=c", Label{"unspec", "a", "b=c"}},
		{"colon in key after source", "k8s:a:b=c", Label{"k8s", "a:b", "c"}},
		{"cidr", "cidr:10.0.0.0/8", Label{"cidr", "10.0.0.0/8", ""}},
		{"ipv6 cidr", "cidr:2001:db8::/32", Label{"cidr", "2001:db8::/32", ""}},
		{"any source", "any:app=web", Label{"any", "app", "web"}},
		{"container source", "container:com.docker.name=x", Label{"container", "com.docker.name", "x"}},
		{"dash in source", "my-src:k=v", Label{"my-src", "k", "v"}},
		{"space in value", "k8s:desc=hello world", Label{"k8s", "desc", "hello world"}},
		{"unicode", "k8s:ünï=ö", Label{"k8s", "ünï", "ö"}},
		{"max lengths", long + ":" + long + "=" + long, Label{long, long, long}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("Parse(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
			if again, err := Parse(got.String()); err != nil || again != got {
				t.Fatalf("Parse(%q) = %#v, %v; want round trip to %#v", got.String(), again, err, got)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	long := strings.Repeat("a", maxLen+1)
	tests := []struct {
		name string
		in   string
		why  string // expected in the message
	}{
		{"empty", "", "empty key"},
		{"empty source", ":app", "empty source"},
		{"empty key after source", "k8s:", "empty key"},
		{"empty key before value", "=web", "empty key"},
		{"upper case source", "K8S:app", "does not match"},
		{"space in source", "k 8s:app", "does not match"},
		{"dot in source", "io.k8s:app", "does not match"},
		{"space in key", "app name=x", "whitespace"},
		{"tab in key", "k8s:app\t=x", "whitespace"},
		{"nbsp in key", "k8s:a\u00a0b", "whitespace"},
		{"control in key", "k8s:a\x7fb", "control character"},
		{"semicolon in key", "k8s:a;b", "contains ';'"},
		{"semicolon in value", "k8s:app=a;b", "separator"},
		{"control in value", "k8s:app=a\x00", "control character"},
		{"newline in value", "k8s:app=a\nb", "control character"},
		{"invalid utf8", "k8s:app=\xff", "not valid UTF-8"},
		{"long source", long + ":k", "source is 254 bytes"},
		{"long key", "k8s:" + long, "key is 254 bytes"},
		{"long value", "k8s:k=" + long, "value is 254 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if !errors.Is(err, ErrInvalidLabel) {
				t.Fatalf("Parse(%q) = %#v, %v; want ErrInvalidLabel", tt.in, got, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, strconv.Quote(Clip(tt.in))) || !strings.Contains(msg, tt.why) {
				t.Fatalf("Parse(%q) error %q: want it to quote the (clipped) input and say %q", tt.in, msg, tt.why)
			}
		})
	}
}

func TestLabelString(t *testing.T) {
	tests := []struct {
		l    Label
		want string
	}{
		{Label{"k8s", "app", "web"}, "k8s:app=web"},
		{Label{"reserved", "host", ""}, "reserved:host"},
		{Label{"unspec", "app", "a:b"}, "unspec:app=a:b"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.l.String(); got != tt.want {
				t.Fatalf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"k8s:app=web", "reserved:host", "app=a:b", "key", "k8s:a:b=c", "a=b=c",
		":x", "k8s:", "=v", "k8s:a;b", "k8s:app=\xff", "cidr:2001:db8::/32", "k8s:app=",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidLabel) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrInvalidLabel", s, err)
			}
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("Parse(%q) = %#v, which fails Validate: %v", s, l, err)
		}
		again, err := Parse(l.String())
		if err != nil {
			t.Fatalf("Parse(%q) (from %q): %v", l.String(), s, err)
		}
		if again != l {
			t.Fatalf("round trip of %q: %#v then %#v", s, l, again)
		}
	})
}

// TestErrorsClipInput checks that a refused huge label or selector is not
// echoed whole in the error message.
func TestErrorsClipInput(t *testing.T) {
	huge := "k8s:app=" + strings.Repeat("v", 1<<20)
	_, errParse := Parse(huge)
	_, errSet := ParseSet([]string{huge})
	_, errSel := ParseSelector("app=" + strings.Repeat("v", 1<<20))
	_, errUTF := Parse(strings.Repeat("\xff", 1<<20))
	for name, err := range map[string]error{"Parse": errParse, "ParseSet": errSet, "ParseSelector": errSel, "invalid UTF-8": errUTF} {
		if err == nil {
			t.Fatalf("%s accepted a 1 MiB label", name)
		}
		if msg := err.Error(); len(msg) > 600 || !strings.Contains(msg, "bytes") {
			t.Errorf("%s error is %d bytes long (%.80q...), want a short message with the length", name, len(msg), msg)
		}
	}
}

func TestClip(t *testing.T) {
	if got := Clip("short"); got != "short" {
		t.Errorf("Clip(short) = %q", got)
	}
	long := strings.Repeat("a", clipLen-1) + "é" + strings.Repeat("b", 100) // é straddles the cut
	got := Clip(long)
	if !utf8.ValidString(got) || !strings.HasSuffix(got, fmt.Sprintf("...(%d bytes)", len(long))) || len(got) > clipLen+20 {
		t.Errorf("Clip = %q", got)
	}
}
