// Package agentmem measures the resident memory of a real membrane-agent
// process (the binary make build makes, flags as the DaemonSet's where
// they matter): standalone with pods added by the real CNI plugin on the
// Linux datapath in a netns of the test's own, and in Kubernetes mode
// against a real kube-apiserver with local pods and other nodes'
// MembraneEndpoints. It reports VmRSS, RssAnon and RssFile, Pss, the Go
// runtime's view (live heap at the last collection, what the heap and
// stacks hold from the OS, the memory limit), the process's CPU time and
// collections, and where the executable's resident pages are, by ELF
// section and by Go package (ReadResident: a pagemap walk). Opt-in (make
// bench-mem), root.
package agentmem
