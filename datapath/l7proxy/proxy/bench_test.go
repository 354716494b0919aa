package proxy

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// BenchmarkHTTP: one GET over a kept-alive connection to the backend,
// directly and through the proxy process enforcing a GET /public rule
// (loopback; the proxy's extra hop and rule matching).
func BenchmarkHTTP(b *testing.B) { benchHTTP(b, newRig(b)) }

// BenchmarkHTTPInProcess is BenchmarkHTTP with the proxy in the test
// process: -cpuprofile shows where the proxy's time goes.
func BenchmarkHTTPInProcess(b *testing.B) { benchHTTP(b, newRigInProcess(b)) }

func benchHTTP(b *testing.B, r *rig) {
	r.setB(1, r.l7(idA, policy.HTTPRule{Method: "GET", Path: "/public"}))
	testutil.Eventually(b, "revision 1 acknowledged", func() bool { return r.w.isAcked(1) })
	proxyURL, _ := url.Parse("http://" + r.listen)
	for _, tc := range []struct {
		name  string
		proxy func(*http.Request) (*url.URL, error)
	}{{"direct", nil}, {"proxy", http.ProxyURL(proxyURL)}} {
		b.Run(tc.name, func(b *testing.B) {
			c := &http.Client{Transport: &http.Transport{Proxy: tc.proxy, MaxIdleConnsPerHost: 1,
				DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
			for b.Loop() {
				resp, err := c.Get("http://" + r.b + "/public")
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if tc.proxy != nil && resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}

// BenchmarkPublishToAck: from publishing a changed endpoint
// configuration to the proxy process's acknowledgement of its version.
func BenchmarkPublishToAck(b *testing.B) {
	r := newRig(b)
	rev := uint64(0)
	for b.Loop() {
		rev++
		r.setB(rev, r.l7(idA, policy.HTTPRule{Method: "GET", Path: "/public"}))
		for !r.w.isAcked(rev) {
			if r.w.nacked(rev) != "" {
				b.Fatal(r.w.nacked(rev))
			}
		}
	}
}
