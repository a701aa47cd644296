// Package phrase words counts in runledger's messages.
package phrase

import "strconv"

// Count is n followed by one or many, as n asks: "1 item", "3 items".
func Count(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.FormatInt(n, 10) + " " + many
}
