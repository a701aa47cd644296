package pgtest

import (
	"fmt"
	"net"
	"sync"
	"testing"
)

// Hook sees every read of one direction of a proxied connection before it is
// forwarded. It returns whether to forward b and go on; false ends the
// connection (both directions) without forwarding b. A hook may block (to
// freeze the connection), write to the conn's ends itself, or close them.
type Hook func(c *ProxyConn, b []byte) bool

// ProxyConn is one proxied connection: the client's end and the server's.
type ProxyConn struct {
	Client, Server net.Conn
}

// ProxyOptions configures a Proxy.
type ProxyOptions struct {
	// Listen is the TCP address to listen on (default 127.0.0.1:0).
	Listen string
	// ToServer and ToClient, when set, see each direction's reads.
	ToServer, ToClient Hook
}

// Proxy forwards TCP connections on a loopback address to a unix socket (a
// test server's), so that a test can cut, freeze or inspect the traffic
// between a client and PostgreSQL without touching the server others use.
type Proxy struct {
	// Addr is the address the proxy listens on.
	Addr *net.TCPAddr
	ln   net.Listener
	once sync.Once
	done chan struct{}
}

// NewProxy starts a proxy to socket (a path, e.g. <dir>/.s.PGSQL.<port>);
// it stops at the end of the test.
func NewProxy(t testing.TB, socket string, opts ProxyOptions) *Proxy {
	t.Helper()
	addr := opts.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("proxy: listening on %s: %v", addr, err)
	}
	p := &Proxy{Addr: ln.Addr().(*net.TCPAddr), ln: ln, done: make(chan struct{})}
	t.Cleanup(p.Close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", socket)
			if err != nil {
				_ = c.Close()
				continue
			}
			pc := &ProxyConn{Client: c, Server: s}
			var cut sync.Once
			end := func() { cut.Do(func() { _ = c.Close(); _ = s.Close() }) }
			go func() { pipe(pc, s, c, opts.ToServer); end() }()
			go func() { pipe(pc, c, s, opts.ToClient); end() }()
		}
	}()
	return p
}

// SocketOf is the unix socket of a server in socketDir listening on port.
func SocketOf(socketDir string, port uint16) string {
	return fmt.Sprintf("%s/.s.PGSQL.%d", socketDir, port)
}

// DSN is a TCP connection string through the proxy.
func (p *Proxy) DSN(user, dbname string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable", p.Addr.Port, user, dbname)
}

// Done is closed once the proxy is closed: a Hook that freezes a
// connection waits on it.
func (p *Proxy) Done() <-chan struct{} { return p.done }

// Close stops accepting connections and releases the hooks waiting on Done.
func (p *Proxy) Close() {
	p.once.Do(func() { close(p.done); _ = p.ln.Close() })
}

// pipe forwards what src reads to dst, through hook, until either fails or
// the hook says stop.
func pipe(pc *ProxyConn, dst, src net.Conn, hook Hook) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if hook != nil && !hook(pc, buf[:n]) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
