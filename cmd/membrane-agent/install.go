package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/membrane-cni/membrane/datapath"
)

// The node-setup subcommands the DaemonSet's init containers run, so the
// image needs no shell: install-cni copies the plugin and its conflist
// onto the host, mount-bpffs mounts the host's bpffs (the one step that
// needs a privileged container; the agent itself runs with a list of
// capabilities).
var subcommands = map[string]func(args []string, stderr io.Writer) int{
	"install-cni": runInstallCNI,
	"mount-bpffs": runMountBPFFS,
	"version":     runVersion,
	"cleanup":     runCleanup,
}

// runVersion prints the agent's version.
func runVersion(_ []string, _ io.Writer) int {
	fmt.Println(version)
	return 0
}

// runInstallCNI copies --plugin into --cni-bin-dir and --conflist into
// --cni-conf-dir, each written beside its target and renamed over it, so
// the runtime never executes or reads a half-written file.
func runInstallCNI(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("membrane-agent install-cni", flag.ContinueOnError)
	fs.SetOutput(stderr)
	self, _ := os.Executable()
	plugin := fs.String("plugin", filepath.Join(filepath.Dir(self), "membrane-cni"), "the membrane-cni binary to install")
	conflist := fs.String("conflist", "/etc/membrane-config/05-membrane.conflist", "the conflist to install")
	binDir := fs.String("cni-bin-dir", "/host/opt/cni/bin", "the host's CNI plugin directory, as mounted")
	confDir := fs.String("cni-conf-dir", "/host/etc/cni/net.d", "the host's CNI configuration directory, as mounted")
	hostPorts := fs.String("host-ports", "", "how pods' hostPorts are done: bpf (the agent, with --kube-proxy-replacement: membrane-cni gets the portMappings capability), portmap (the portmap plugin chained after membrane-cni); empty: the conflist as it is")
	if err := fs.Parse(args); err != nil {
		return exitParse(err)
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "membrane-agent install-cni: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := installFile(*plugin, *binDir, nil); err != nil {
		fmt.Fprintf(stderr, "membrane-agent install-cni: %v\n", err)
		return 1
	}
	var change func([]byte) ([]byte, error)
	if *hostPorts != hostPortsAsIs {
		change = func(raw []byte) ([]byte, error) {
			var portmapVersions []string
			if *hostPorts == hostPortsPortmap {
				vs, err := pluginVersions(filepath.Join(*binDir, "portmap"))
				if err != nil {
					return nil, err
				}
				portmapVersions = vs
			}
			out, err := conflistForHostPorts(raw, *hostPorts, portmapVersions)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", *conflist, err)
			}
			return append(out, '\n'), nil
		}
	}
	if err := installFile(*conflist, *confDir, change); err != nil {
		fmt.Fprintf(stderr, "membrane-agent install-cni: %v\n", err)
		return 1
	}
	return 0
}

// pluginVersions runs the CNI plugin at path with CNI_COMMAND=VERSION
// (bounded by pluginVersionTimeout) and returns the versions it supports.
func pluginVersions(path string) ([]string, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("--host-ports portmap needs the portmap plugin (containernetworking-plugins) on the node: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pluginVersionTimeout)
	defer cancel()
	info, err := invoke.GetVersionInfo(ctx, path, nil)
	if err != nil {
		return nil, fmt.Errorf("%s VERSION: %w", path, err)
	}
	return info.SupportedVersions(), nil
}

// pluginVersionTimeout bounds a plugin's VERSION answer.
const pluginVersionTimeout = 10 * time.Second

// installFile copies src into dir under its base name, keeping src's
// permission bits, through a temporary file in dir renamed over the
// target; change, if not nil, rewrites the content on the way (the
// conflist for --host-ports). Nothing is written anywhere else: the
// image has no /tmp and the init container's root is read-only.
func installFile(src, dir string, change func([]byte) ([]byte, error)) (retErr error) {
	name := filepath.Base(src)
	if name == "." || name == ".." || name == "/" {
		return fmt.Errorf("install %s: invalid file name", src)
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("install %s: %w", src, err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return fmt.Errorf("install %s: %w", src, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("install %s: not a regular file", src)
	}
	var r io.Reader = in
	if change != nil {
		raw, err := io.ReadAll(in)
		if err != nil {
			return fmt.Errorf("install %s: %w", src, err)
		}
		out, err := change(raw)
		if err != nil {
			return err
		}
		r = bytes.NewReader(out)
	}
	tmp, err := os.CreateTemp(dir, "."+name+".new-*")
	if err != nil {
		return fmt.Errorf("install %s into %s: %w", src, dir, err)
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, r); err != nil {
		return fmt.Errorf("install %s into %s: %w", src, dir, err)
	}
	if err := tmp.Chmod(st.Mode().Perm()); err != nil {
		return fmt.Errorf("install %s into %s: %w", src, dir, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("install %s into %s: %w", src, dir, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install %s into %s: %w", src, dir, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("install %s into %s: %w", src, dir, err)
	}
	return nil
}

func runMountBPFFS(args []string, stderr io.Writer) int {
	if len(args) != 0 {
		fmt.Fprintf(stderr, "membrane-agent mount-bpffs: takes no arguments\n")
		return 2
	}
	if err := datapath.MountBPFFS(); err != nil {
		fmt.Fprintf(stderr, "membrane-agent mount-bpffs: %v\n", err)
		return 1
	}
	return 0
}

func exitParse(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}
