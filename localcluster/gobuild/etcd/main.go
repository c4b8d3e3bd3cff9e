// Command etcd runs the etcd server of the pinned release; it exists so that the
// local control plane can build etcd from Go modules alone.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
