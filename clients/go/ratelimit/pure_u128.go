package ratelimit

import "math/bits"

// u128 is an unsigned 128-bit integer, for the token and leaky buckets'
// GCRA in ticks (products up to 2^114), as the core computes in u128.
// Every operation saturates at the type's bounds instead of wrapping.
type u128 struct{ hi, lo uint64 }

const maxU64 = ^uint64(0)

var maxU128 = u128{maxU64, maxU64}

func u128of(x uint64) u128 { return u128{0, x} }

// mul64 is a x b, exact.
func mul64(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

// mul is a x b, saturating.
func (a u128) mul(b uint64) u128 {
	h1, l1 := bits.Mul64(a.lo, b)
	h2, l2 := bits.Mul64(a.hi, b)
	if h2 != 0 {
		return maxU128
	}
	hi, c := bits.Add64(h1, l2, 0)
	if c != 0 {
		return maxU128
	}
	return u128{hi, l1}
}

// add is a + b, saturating.
func (a u128) add(b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, c := bits.Add64(a.hi, b.hi, c)
	if c != 0 {
		return maxU128
	}
	return u128{hi, lo}
}

// sub is a - b, 0 when b > a.
func (a u128) sub(b u128) u128 {
	lo, br := bits.Sub64(a.lo, b.lo, 0)
	hi, br := bits.Sub64(a.hi, b.hi, br)
	if br != 0 {
		return u128{}
	}
	return u128{hi, lo}
}

func (a u128) cmp(b u128) int {
	switch {
	case a.hi < b.hi:
		return -1
	case a.hi > b.hi:
		return 1
	case a.lo < b.lo:
		return -1
	case a.lo > b.lo:
		return 1
	}
	return 0
}

func (a u128) isZero() bool { return a.hi == 0 && a.lo == 0 }

func minU128(a, b u128) u128 {
	if a.cmp(b) <= 0 {
		return a
	}
	return b
}

// divmod is a / d and a % d (d > 0).
func (a u128) divmod(d uint64) (u128, uint64) {
	qhi := a.hi / d
	r := a.hi % d
	qlo, r := bits.Div64(r, a.lo, d)
	return u128{qhi, qlo}, r
}

// div is a / d (d > 0).
func (a u128) div(d uint64) u128 {
	q, _ := a.divmod(d)
	return q
}

// ceilDiv is ceil(a / d) (d > 0).
func (a u128) ceilDiv(d uint64) u128 {
	q, r := a.divmod(d)
	if r != 0 {
		q = q.add(u128of(1))
	}
	return q
}

// u64 is a as a uint64, saturating.
func (a u128) u64() uint64 {
	if a.hi != 0 {
		return maxU64
	}
	return a.lo
}
