// Command membrane-image writes Membrane's container image as a
// docker-archive tarball, without Docker or a registry (`make image`):
//
//	membrane-image -bin bin/static -out bin/membrane-image.tar -tag localhost/membrane:dev
//
// The programs in -bin must be static (CGO_ENABLED=0). The same inputs
// give the same digest, which it prints. Load the tarball with
// `ctr -n k8s.io images import` (or `docker load`, `kind load image-archive`).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/membrane-cni/membrane/pkg/image"
)

func main() {
	bin := flag.String("bin", "bin/static", "directory holding the static programs: "+fmt.Sprint(image.Programs))
	conflist := flag.String("conflist", "deploy/05-membrane.conflist", "CNI network configuration the image carries")
	out := flag.String("out", "bin/membrane-image.tar", "tarball to write")
	tag := flag.String("tag", "localhost/membrane:dev", "image reference in the tarball")
	version := flag.String("version", "dev", "version label")
	flag.Parse()
	spec, err := image.Membrane(*tag, *bin, *conflist, *version)
	if err == nil {
		var d fmt.Stringer
		d, err = image.Write(spec, *out)
		if err == nil {
			fmt.Printf("%s %s %s\n", *out, *tag, d)
			return
		}
	}
	fmt.Fprintln(os.Stderr, "membrane-image:", err)
	os.Exit(1)
}
