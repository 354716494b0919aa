package l7proxy

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// listenPrivate listens on the unix socket path with mode 0600 from its
// first moment: it binds a temporary name beside path, sets the mode and
// renames it into place, so no process can connect while the mode still
// follows the umask.
func listenPrivate(path string) (net.Listener, error) {
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d", filepath.Base(path), os.Getpid()))
	_ = os.Remove(tmp)
	lis, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		lis.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		lis.Close()
		os.Remove(tmp)
		return nil, err
	}
	return lis, nil
}

// PeerCheck decides whether the process at the other end of an xDS
// connection may subscribe (its credentials from SO_PEERCRED).
type PeerCheck func(cred *unix.Ucred) bool

// SameUser accepts processes of the agent's own user (the default: the
// socket's mode already keeps others out, this refuses them again should
// the mode be changed).
func SameUser(cred *unix.Ucred) bool { return cred.Uid == uint32(os.Getuid()) }

// peerListener hands out only connections whose peer passes check;
// others are closed at once and logged.
type peerListener struct {
	net.Listener
	check atomic.Pointer[PeerCheck]
	log   *slog.Logger
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, err := peerCred(c)
		if err == nil && (*l.check.Load())(cred) {
			return c, nil
		}
		if err != nil {
			l.log.Warn("xds connection refused: no peer credentials", "err", err)
		} else {
			l.log.Warn("xds connection refused: not the agent's proxy", "pid", cred.Pid, "uid", cred.Uid)
		}
		c.Close()
	}
}

func peerCred(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("not a unix connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) { cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, serr
}
