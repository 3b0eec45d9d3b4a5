package ratelimit

// The pure arithmetic of grants (contract.json "grants"; SPEC "One limit
// larger than one node"): the batch a batched rule asks with UPTO, when it
// asks again, the shares of a striped rule's stripes and the hash tags that
// put stripe i on master i mod M. No I/O: grants.go runs them.

import (
	"cmp"
	"slices"
	"strconv"
	"time"
)

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// BatchSize is the batch of a batched rule (contract grants.batched.batch):
// clamp(ceil(ratePerS x holdMs / 1000), 1, max(1, floor(limit x
// maxSharePct / 100))), in integers; limit is a token bucket's capacity, the
// others' limit. A negative input counts as 0.
func BatchSize(ratePerS, holdMs, limit, maxSharePct int64) int64 {
	nn := func(x int64) uint64 { return uint64(max(x, 0)) }
	want := mul64(nn(ratePerS), nn(holdMs)).ceilDiv(1000)
	limitCap := max(mul64(nn(limit), nn(maxSharePct)).div(100).u64(), 1)
	b := max(min(want.u64(), limitCap), 1)
	return satI64(b)
}

// NextAskAfter is when a batched rule may ask again after the reply to
// UPTO asked that granted granted units, with the reply's waitMs: a grant
// below what was asked, holdMs after the ask (a grant of all asked: as soon
// as nothing is held, delay 0); a denial, max(waitMs, holdMs when asked > 1,
// else 0) after the ask; a denial with waitMs -1, never (until the rule
// changes).
func NextAskAfter(asked, granted, waitMs, holdMs int64) (delay time.Duration, never bool) {
	hold := time.Duration(max(holdMs, 0)) * time.Millisecond
	if granted >= 1 {
		if granted < asked {
			return hold, false
		}
		return 0, false
	}
	if waitMs < 0 {
		return 0, true
	}
	wait := time.Duration(waitMs) * time.Millisecond
	if asked > 1 {
		wait = max(wait, hold)
	}
	return wait, false
}

// StripeShare is stripe i's share of total among n (contract
// grants.stripes.share): total / n, plus 1 if i < total % n. 0 when n < 1
// or i is not a stripe.
func StripeShare(total int64, i, n int) int64 {
	if n < 1 || i < 0 || i >= n || total < 0 {
		return 0
	}
	s := total / int64(n)
	if int64(i) < total%int64(n) {
		s++
	}
	return s
}

// StripeShares is the n stripes' shares of total (StripeShare of each); nil
// when n < 1. A share of 0 refuses the striped rule (the caller names
// "striped").
func StripeShares(total int64, n int) []int64 {
	if n < 1 {
		return nil
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = StripeShare(total, i, n)
	}
	return out
}

// StripeTag is the i-th candidate hash tag, "rl<i>".
func StripeTag(i int) string { return "rl" + strconv.Itoa(i) }

// slotOwners maps each slot to the index of the master owning it (-1:
// none), masters in the order of the lowest slot each owns.
func slotOwners(masters [][][2]int) (owners []int16, m int) {
	type master struct {
		lowest int
		ranges [][2]int
	}
	ms := make([]master, 0, len(masters))
	for _, rs := range masters {
		lowest := clusterSlots
		for _, r := range rs {
			lowest = min(lowest, max(min(r[0], r[1]), 0))
		}
		ms = append(ms, master{lowest, rs})
	}
	slices.SortStableFunc(ms, func(a, b master) int { return cmp.Compare(a.lowest, b.lowest) })
	owners = make([]int16, clusterSlots)
	for i := range owners {
		owners[i] = -1
	}
	for i, mm := range ms {
		for _, r := range mm.ranges {
			for s := max(r[0], 0); s <= min(r[1], clusterSlots-1); s++ {
				owners[s] = int16(i)
			}
		}
	}
	return owners, len(ms)
}

// PickStripeTags is the hash tags of n stripes (contract
// grants.stripes.tags): masters (each a list of inclusive slot ranges, in
// any order) are taken in the order of the lowest slot each owns; stripe i
// goes on master i mod M, its tag the first rl0, rl1, rl2, ... whose slot
// (KeySlot: CRC16-XMODEM mod 16384) that master owns and that no earlier
// stripe took. No masters (or none owning a slot): rl0 ... rl<n-1>. A master that owns no
// slot (never in a sane slot map) gets the first free tag of any master.
func PickStripeTags(masters [][][2]int, n int) []string {
	if n < 1 {
		return nil
	}
	tags := make([]string, 0, n)
	owners, m := slotOwners(masters)
	owns := make([]bool, m)
	someOwned := false
	for _, o := range owners {
		if o >= 0 {
			owns[o] = true
			someOwned = true
		}
	}
	if !someOwned {
		for i := range n {
			tags = append(tags, StripeTag(i))
		}
		return tags
	}
	taken := make(map[string]bool, n)
	for i := range n {
		target := i % m
		anyMaster := !owns[target]
		tag := ""
		// Every master owns a slot of 16384, and a tag falls in any one
		// slot with odds 1/16384: this ends long before the bound.
		for k := 0; k < 1<<24; k++ {
			t := StripeTag(k)
			o := owners[KeySlot(t)]
			if !taken[t] && (o == int16(target) || anyMaster && o >= 0) {
				tag = t
				break
			}
		}
		if tag == "" {
			tag = StripeTag(i)
		}
		taken[tag] = true
		tags = append(tags, tag)
	}
	return tags
}
