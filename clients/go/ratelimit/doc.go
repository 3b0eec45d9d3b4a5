// Package ratelimit is the Go client kit of redis-ratelimit: typed calls for
// the module's RL.* commands on go-redis v9 (standalone, Sentinel through its
// failover client, and cluster), and the Limiter of the other kits (deny
// cache, local level, grants and stripes, fallback with a breaker, leases,
// calendar quotas, the protection loop), with net/http middleware.
//
// The vocabulary is the contract's (clients/contract/contract.json), in Go's
// convention: Client (typed calls), Spec (an algorithm and its parameters),
// Rule (a named spec with its scope), Decision, Limiter, Lease, and the
// errors ErrModuleMissing, ErrProtocol, ErrTimeout and *InvalidArgumentError.
//
// Durations in a Spec are integer milliseconds, as the commands take them
// (their names end in Ms); what a Decision reports is a time.Duration.
package ratelimit
