// Command plugincpu measures the CNI plugin process's own CPU time per
// call (issue #39): it execs each binary given (a membrane-cni build, or
// test/plugincpu/floor, a Go program that only starts and exits: the Go
// runtime's floor) -n times, in turn, with CNI_COMMAND -cmd (ADD by
// default) against a canned POST /v1/attach answer on a unix socket of
// its own, and prints per binary the median, quartiles and mean of the
// exec'd process's user+sys CPU (rusage), its minor page faults and
// system time. Only the plugin process is measured: the agent's work is
// test/cnibench's (make bench-cni). Not root; touches nothing but a temp
// directory. PLUGIN_GODEBUG and PLUGIN_PHASES set the plugin's GODEBUG
// and MEMBRANE_CNI_PHASES.
//
//	CGO_ENABLED=0 go build -trimpath -o /tmp/floor ./test/plugincpu/floor
//	CGO_ENABLED=0 go build -trimpath -o /tmp/membrane-cni ./cmd/membrane-cni
//	go run ./test/plugincpu -n 500 /tmp/floor /tmp/membrane-cni
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func main() {
	n := flag.Int("n", 300, "runs per binary")
	cmdName = flag.String("cmd", "ADD", "CNI_COMMAND")
	flag.Parse()
	bins := flag.Args()
	if len(bins) == 0 {
		fmt.Fprintln(os.Stderr, "usage: plugincpu [-n runs] [-cmd ADD|VERSION|...] binary...")
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "plugincpu")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		panic(err)
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req models.AttachRequest
		if r.URL.Path != "/v1/attach" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, `{"code":"bad"}`, 400)
			return
		}
		host, _ := cni.VethNames(req.ContainerID, req.ContainerInterfaceName)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Server-Timing", "ipam;dur=0.01, veth;dur=0.2")
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(models.AttachResponse{EndpointID: 7,
			HostInterface: models.AttachInterface{Name: host, Index: 5, Mac: "02:00:00:00:00:01"},
			PodInterface:  models.AttachInterface{Name: "eth0", Index: 2, Mac: "02:00:00:00:00:02"},
			IPv4:          &models.AttachAddress{IP: "10.1.0.5", Gateway: "10.1.0.1"}, RouteMTU: 1500})
	}))
	netnsPath := filepath.Join(dir, "netns")
	// ADD only stats CNI_NETNS before it asks the agent.
	if err := os.WriteFile(netnsPath, nil, 0o644); err != nil {
		panic(err)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"bench","type":"membrane-cni","socket":%q,"deleteQueueDir":%q}`, sock, filepath.Join(dir, "dq"))
	cpu := make([][]time.Duration, len(bins))
	faults := make([][]int64, len(bins))
	sys := make([][]time.Duration, len(bins))
	for i := 0; i < *n; i++ {
		for b, bin := range bins {
			cmd := exec.Command(bin)
			cmd.Env = []string{"CNI_COMMAND=" + *cmdName, fmt.Sprintf("CNI_CONTAINERID=c%08d", i), "CNI_NETNS=" + netnsPath,
				"CNI_IFNAME=eth0", "GODEBUG=" + os.Getenv("PLUGIN_GODEBUG"), "MEMBRANE_CNI_PHASES=" + os.Getenv("PLUGIN_PHASES"), "CNI_PATH=/opt/cni/bin", "CNI_ARGS=K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=x"}
			cmd.Stdin = strings.NewReader(conf)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			if err != nil && !strings.Contains(bin, "floor") {
				fmt.Fprintf(os.Stderr, "%s: %v: %s %s\n", bin, err, out.String(), errb.String())
				os.Exit(1)
			}
			if i == 0 && *cmdName == "ADD" && !strings.Contains(bin, "floor") && !strings.Contains(out.String(), "10.1.0.5/32") {
				fmt.Fprintf(os.Stderr, "%s: unexpected output %s\n", bin, out.String())
				os.Exit(1)
			}
			if i == 0 && os.Getenv("PLUGIN_GODEBUG") != "" {
				fmt.Fprintf(os.Stderr, "%s stderr:\n%s\n", bin, errb.String())
			}
			ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			cpu[b] = append(cpu[b], time.Duration(ru.Utime.Nano()+ru.Stime.Nano()))
			faults[b] = append(faults[b], ru.Minflt)
			sys[b] = append(sys[b], time.Duration(ru.Stime.Nano()))
		}
	}
	for b, bin := range bins {
		c := cpu[b]
		sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
		sort.Slice(faults[b], func(i, j int) bool { return faults[b][i] < faults[b][j] })
		sort.Slice(sys[b], func(i, j int) bool { return sys[b][i] < sys[b][j] })
		var sum time.Duration
		for _, d := range c {
			sum += d
		}
		fmt.Printf("%-40s runs %d  CPU median %6.0fus  p25 %6.0fus  p75 %6.0fus  mean %6.0fus  minflt median %d  sys median %6.0fus\n", bin, len(c),
			us(c[len(c)/2]), us(c[len(c)/4]), us(c[3*len(c)/4]), us(sum/time.Duration(len(c))), faults[b][len(c)/2], us(sys[b][len(c)/2]))
	}
}

var cmdName *string

func us(d time.Duration) float64 { return float64(d) / 1e3 }
