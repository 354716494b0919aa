package cni

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

const chainedNetns = "/var/run/netns/pod"

// chainedConf is a conflist entry after ptp with prevResult prev.
func chainedConf(prev string) []byte {
	return []byte(`{"cniVersion":"1.0.0","name":"k8s","type":"membrane-cni","prevResult":` + prev + `}`)
}

// ptpResult is a ptp result: host veth, eth0 in chainedNetns, addresses
// on interface 1.
const ptpResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"veth1234","mac":"aa:bb:cc:dd:ee:01"},
{"name":"eth0","mac":"aa:bb:cc:dd:ee:02","sandbox":"/var/run/netns/pod"}],
"ips":[{"interface":1,"address":"10.238.0.5/24","gateway":"10.238.0.1"},{"interface":1,"address":"fd00:238::5/120","gateway":"fd00:238::1"}],
"routes":[{"dst":"0.0.0.0/0"}]}`

func chainedArgs(conf []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", Netns: chainedNetns, IfName: "eth0", StdinData: conf}
}

func TestChainedAttachment(t *testing.T) {
	conf, err := ParseConfig(chainedConf(ptpResult))
	if err != nil {
		t.Fatal(err)
	}
	prev, ch, err := ChainedAttachment(conf, chainedArgs(nil))
	if err != nil {
		t.Fatal(err)
	}
	if ch.HostInterface != "veth1234" || ch.IPv4 != "10.238.0.5" || ch.IPv6 != "fd00:238::5" || len(prev.IPs) != 2 {
		t.Errorf("attachment %+v from %v", ch, prev)
	}
}

// TestChainedAttachmentRefuses: every malformed or foreign prevResult is
// CNI error 7 naming prevResult, before the agent is asked.
func TestChainedAttachmentRefuses(t *testing.T) {
	swap := func(old, new string) string { return strings.Replace(ptpResult, old, new, 1) }
	for _, tc := range []struct{ name, prev string }{
		{"not an object", `[]`},
		{"no interfaces", `{"cniVersion":"1.0.0","ips":[{"address":"10.238.0.5/24"}]}`},
		{"pod interface in another sandbox", swap(`"sandbox":"/var/run/netns/pod"`, `"sandbox":"/var/run/netns/other"`)},
		{"no pod interface", swap(`"name":"eth0"`, `"name":"eth1"`)},
		{"address without interface", swap(`{"interface":1,"address":"10.238.0.5/24"`, `{"address":"10.238.0.5/24"`)},
		{"address on a missing interface", swap(`{"interface":1,"address":"10.238.0.5/24"`, `{"interface":7,"address":"10.238.0.5/24"`)},
		{"no address on the pod interface", strings.ReplaceAll(ptpResult, `"interface":1`, `"interface":0`)},
		{"two IPv4 addresses", swap(`"fd00:238::5/120","gateway":"fd00:238::1"`, `"10.238.0.6/24","gateway":"10.238.0.1"`)},
		{"gateway of the other family", swap(`"gateway":"10.238.0.1"`, `"gateway":"fd00:238::1"`)},
		{"unspecified address", swap(`"10.238.0.5/24"`, `"0.0.0.0/24"`)},
		{"bad host interface name", swap(`"name":"veth1234"`, `"name":"../all"`)},
		{"two pod interfaces", swap(`{"name":"veth1234","mac":"aa:bb:cc:dd:ee:01"}`, `{"name":"eth0","sandbox":"/var/run/netns/pod"}`)},
		{"null interface", swap(`{"name":"veth1234","mac":"aa:bb:cc:dd:ee:01"}`, `null`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf, err := ParseConfig(chainedConf(tc.prev))
			if err == nil {
				_, _, err = ChainedAttachment(conf, chainedArgs(nil))
			}
			if code(err) != types.ErrInvalidNetworkConfig && code(err) != types.ErrDecodingFailure {
				t.Fatalf("prevResult %s: %v (code %d), want CNI error 7", tc.prev, err, code(err))
			}
			if code(err) == types.ErrInvalidNetworkConfig && !strings.Contains(err.Error(), "prevResult") {
				t.Errorf("error %v does not name prevResult", err)
			}
		})
	}
}

// FuzzChainedAttachment: any prevResult either is refused with CNI error
// 7 (or 6, undecodable) or yields at most one address per family, each
// valid and of its field's family, and a valid host interface name.
func FuzzChainedAttachment(f *testing.F) {
	f.Add([]byte(ptpResult), "eth0", chainedNetns)
	f.Add([]byte(`{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"interface":0,"address":"::ffff:10.0.0.1/128"}]}`), "eth0", "/x")
	f.Add([]byte(`{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"version":"4","interface":0,"address":"10.0.0.1/32"}]}`), "eth0", "/x")
	f.Fuzz(func(t *testing.T, prev []byte, ifName, netns string) {
		conf, err := ParseConfig(chainedConf(string(prev)))
		if err != nil {
			return
		}
		args := &skel.CmdArgs{ContainerID: "c1", Netns: netns, IfName: ifName}
		res, ch, err := ChainedAttachment(conf, args)
		if err != nil {
			if c := code(err); c != types.ErrInvalidNetworkConfig && c != types.ErrDecodingFailure {
				t.Fatalf("error %v: code %d", err, c)
			}
			return
		}
		if res == nil || ch == nil || (ch.IPv4 == "" && ch.IPv6 == "") {
			t.Fatalf("accepted without an address: %+v", ch)
		}
		for _, a := range []struct {
			s   string
			is4 bool
		}{{ch.IPv4, true}, {ch.IPv6, false}} {
			if a.s == "" {
				continue
			}
			ip, err := netip.ParseAddr(a.s)
			if err != nil || ip.Is4() != a.is4 || ip.Is4In6() || ip.IsUnspecified() {
				t.Fatalf("address %q accepted as IPv4=%v", a.s, a.is4)
			}
		}
		if ch.HostInterface != "" && !ifname.Valid(ch.HostInterface) {
			t.Fatalf("host interface %q accepted", ch.HostInterface)
		}
	})
}
