//go:build !linux

package ledger

import (
	"syscall"
	"time"
)

// userTimeout: TCP_USER_TIMEOUT is Linux's; elsewhere keep-alive alone
// notices a lost server.
func userTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
