package datapath

import "fmt"

// CleanupConfig names what an agent made on a node: the values of its
// flags (the defaults when empty).
type CleanupConfig struct {
	// BPFFS is the agent's bpffs directory (--bpffs): every pin under it
	// goes, and with the pins the TCX and cgroup links they held.
	BPFFS string
	// GatewayDevice and TunnelDevice are the devices the agent created.
	GatewayDevice, TunnelDevice string
	// HealthNetns is the health endpoint's network namespace (a bind
	// mount under the state directory); "" when none.
	HealthNetns string
	// HealthIfName is the health endpoint's host veth.
	HealthIfName string
}

// CleanupReport counts what Cleanup removed.
type CleanupReport struct {
	Links, Filters, Routes, Rules, NFTables, Pins int
}

func (r CleanupReport) String() string {
	return fmt.Sprintf("links=%d tc-filters=%d routes=%d rules=%d nftables=%d bpffs-entries=%d",
		r.Links, r.Filters, r.Routes, r.Rules, r.NFTables, r.Pins)
}
