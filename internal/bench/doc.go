// Package bench measures runledger's insert path against baselines measured in
// the same process, on a durable PostgreSQL (fsync on): the machine is shared
// and noisy, so only ratios between numbers taken side by side mean anything.
//
//	make bench
package bench
