package ratelimit

// The HTTP answer of a decision, as every kit writes it (the contract's
// "headers" vectors, byte for byte): the RateLimit-Policy and RateLimit
// items of the IETF rate-limit header fields draft, Retry-After, and the
// problem+json body (RFC 9457) of a denial. Pure functions, no I/O; the
// middleware writes what they return.

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// ProblemContentType is the Content-Type of a denial's body.
const ProblemContentType = "application/problem+json"

// QuotaExceededType is the problem type of a denial.
const QuotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// QuotaExceededTitle is the problem title of a denial.
const QuotaExceededTitle = "Request cannot be satisfied as assigned quota has been exceeded"

// The header names the answer sets (canonical form).
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderRateLimit       = "RateLimit"
	HeaderRetryAfter      = "Retry-After"
)

// periodNominalS is a quota period's nominal length in seconds, the w of
// its RateLimit-Policy (contract "periods": a month is 30 days, a year 365).
func periodNominalS(p Period) int64 {
	switch p {
	case PeriodDay:
		return 86_400
	case PeriodWeek:
		return 604_800
	case PeriodMonth:
		return 2_592_000
	case PeriodYear:
		return 31_536_000
	}
	return 0
}

// PolicyWindowSeconds is the w of a spec's RateLimit-Policy item, in seconds
// rounded up: the window for the windows, the time to refill an empty bucket
// (capacity x refillMs / refillCount) for the buckets, the period's nominal
// length for a quota (a month is 30 days, a year 365). ok is false for
// concurrency, which has no window (and for a spec that is not valid).
func PolicyWindowSeconds(spec Spec) (w int64, ok bool) {
	p := spec.params
	var ms uint64
	switch spec.algorithm {
	case AlgorithmTokenBucket, AlgorithmLeakyBucket:
		if p[0] < 0 || p[1] <= 0 || p[2] < 0 {
			return 0, false
		}
		ms = ceilDivMul(uint64(p[0]), uint64(p[2]), uint64(p[1]))
	case AlgorithmFixedWindow, AlgorithmSliding, AlgorithmHashWindow:
		if p[1] < 0 {
			return 0, false
		}
		ms = uint64(p[1])
	case AlgorithmQuota:
		s := periodNominalS(Period(p[1]))
		return s, s > 0
	default:
		return 0, false
	}
	s := ms/1000 + boolU64(ms%1000 != 0)
	if s > math.MaxInt64 {
		s = math.MaxInt64
	}
	return int64(s), true
}

// ceilDivMul is ceil(a x b / c) in 128 bits, saturated at MaxUint64.
func ceilDivMul(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	lo, carry := bits.Add64(lo, c-1, 0)
	hi += carry
	if hi >= c {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, c)
	return q
}

func boolU64(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// PolicyItem is a RateLimit-Policy item: "rule";q=<limit>;w=<window s>,
// without w for concurrency. The rule's name is written as given.
func PolicyItem(rule string, spec Spec) string {
	b := make([]byte, 0, len(rule)+40)
	b = append(b, '"')
	b = append(b, rule...)
	b = append(b, `";q=`...)
	b = strconv.AppendInt(b, spec.params[0], 10)
	if w, ok := PolicyWindowSeconds(spec); ok {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, w, 10)
	}
	return string(b)
}

// RateLimitItem is the RateLimit item of a decision:
// "rule";r=<remaining>;t=<ceil(reset ms / 1000)>. Several items (one per
// rule that decided) are joined with ", ".
func RateLimitItem(rule string, d Decision) string {
	b := make([]byte, 0, len(rule)+40)
	b = append(b, '"')
	b = append(b, rule...)
	b = append(b, `";r=`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, ceilSeconds(d.ResetAfter.Milliseconds()), 10)
	return string(b)
}

// RetryAfterSeconds is Retry-After in whole seconds, ceil(wait ms / 1000),
// for a denial; ok is false when admitted and when the request can never
// pass (Decision.Never).
func RetryAfterSeconds(d Decision) (s int64, ok bool) {
	if d.Allowed || d.WaitMs < 0 {
		return 0, false
	}
	return ceilSeconds(waitMs(d)), true
}

// waitMs is the decision's wait in milliseconds: WaitMs, or RetryAfter
// rounded up to the millisecond when only that is set.
func waitMs(d Decision) int64 {
	if d.WaitMs != 0 || d.RetryAfter <= 0 {
		return d.WaitMs
	}
	return int64((d.RetryAfter + time.Millisecond - 1) / time.Millisecond)
}

func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return ms/1000 + int64(boolU64(ms%1000 != 0))
}

// RateLimitFields are the header values of one rule's answer.
type RateLimitFields struct {
	// RateLimitPolicy is the RateLimit-Policy item (PolicyItem).
	RateLimitPolicy string
	// RateLimit is the RateLimit item (RateLimitItem).
	RateLimit string
	// RetryAfter is Retry-After in seconds, "" when admitted or when the
	// request can never pass.
	RetryAfter string
}

// HeaderFields is the header values of the answer to a decision by the
// rule named rule, whose spec is spec: the contract's "headers" vectors.
func HeaderFields(rule string, spec Spec, d Decision) RateLimitFields {
	f := RateLimitFields{RateLimitPolicy: PolicyItem(rule, spec), RateLimit: RateLimitItem(rule, d)}
	if s, ok := RetryAfterSeconds(d); ok {
		f.RetryAfter = strconv.FormatInt(s, 10)
	}
	return f
}

// Apply sets the fields on h (RateLimit-Policy, RateLimit, and Retry-After
// when there is one; an empty field is not set).
func (f RateLimitFields) Apply(h http.Header) {
	if f.RateLimitPolicy != "" {
		h.Set(HeaderRateLimitPolicy, f.RateLimitPolicy)
	}
	if f.RateLimit != "" {
		h.Set(HeaderRateLimit, f.RateLimit)
	}
	if f.RetryAfter != "" {
		h.Set(HeaderRetryAfter, f.RetryAfter)
	}
}

// ProblemBody is the application/problem+json body of a denial by the rule
// named rule (status 429), its members in the contract's order: detail
// ("rate limit "<rule>" exceeded; retry after N s", or "...; this request
// can never pass"), status, title, type, violated-policies. Nil when d
// admitted.
func ProblemBody(rule string, d Decision) []byte {
	if d.Allowed {
		return nil
	}
	detail := make([]byte, 0, len(rule)+48)
	detail = append(detail, "rate limit "...)
	detail = appendJSONString(detail, rule)
	if s, ok := RetryAfterSeconds(d); ok {
		detail = append(detail, " exceeded; retry after "...)
		detail = strconv.AppendInt(detail, s, 10)
		detail = append(detail, " s"...)
	} else {
		detail = append(detail, " exceeded; this request can never pass"...)
	}
	return Problem(http.StatusTooManyRequests, QuotaExceededType, QuotaExceededTitle, string(detail), rule)
}

// Problem is an RFC 9457 problem+json body with the members detail, status,
// title, type and, when violated is not "", violated-policies (a list of
// that one name), in that order, strings escaped as JSON (only '"', '\'
// and control characters; nothing else, as the other kits write them).
func Problem(status int, typ, title, detail, violated string) []byte {
	b := make([]byte, 0, 96+len(typ)+len(title)+2*len(detail)+len(violated))
	b = append(b, `{"detail":`...)
	b = appendJSONString(b, detail)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"title":`...)
	b = appendJSONString(b, title)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	if violated != "" {
		b = append(b, `,"violated-policies":[`...)
		b = appendJSONString(b, violated)
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string the way serde_json and
// JSON.stringify write it: '"' and '\' escaped, \b \f \n \r \t, other
// control characters as \u00xx; invalid UTF-8 as the escape \ufffd. The deny events write their
// strings with it too.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
