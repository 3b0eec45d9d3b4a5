package ratelimit

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Rule is one named limit of a Limiter: an inline Spec (sent with every
// call) or a policy kept in the server (RL.HIT), and the key it applies to.
// A Rule is a value: its builders return a changed copy. Nothing is checked
// until Limiter.RuleSet (or Validate), which names the first bad argument.
type Rule struct {
	name     string
	spec     Spec
	inline   bool
	policy   string
	prefix   string
	prefixed bool
	key      string // a global rule's one key
	global   bool
	batch    *Batch
	stripes  int
	breaker  string
}

// Batch is how a batched rule takes its grants (Rule.Batched): units are
// taken from the server with UPTO and spent in process.
type Batch struct {
	// HoldMs is how long units may stay held in process before they go back
	// with REFUND (1 to 60,000).
	HoldMs int64
	// MaxSharePct is the largest batch, in percent of the rule's limit (1 to
	// 100).
	MaxSharePct int64
}

// DefaultBatch is the batch of the other kits: 50 ms held, at most 10 % of
// the limit at once.
var DefaultBatch = Batch{HoldMs: 50, MaxSharePct: 10}

// MaxStripes is the most stripes a rule may have (Rule.Striped).
const MaxStripes = 64

// NewRule is a rule applying spec per identity: its key is name + ":" +
// identity (Prefix changes the part before the identity).
func NewRule(name string, spec Spec) Rule {
	return Rule{name: name, spec: spec, inline: true, stripes: 1}
}

// PolicyRule is a rule applying the server's policy (RL.POLICY SET) with
// RL.HIT, or POLICY name in RL.ALL; its key is name + ":" + identity.
func PolicyRule(name, policy string) Rule {
	return Rule{name: name, policy: policy, stripes: 1}
}

// Prefix makes the rule's key p + identity.
func (r Rule) Prefix(p string) Rule {
	r.prefix, r.prefixed = p, true
	return r
}

// Global makes key the rule's one key, for every identity: a global limit.
// With the local level on (the default), each instance first takes its share
// of it in process (WithInstances), and what the share denies never reaches
// Redis. Only inline rules can be global.
func (r Rule) Global(key string) Rule {
	r.key, r.global = key, true
	return r
}

// Batched makes a global rule take its units from the server in batches
// (UPTO) and spend them in process (Path PathGrant): the limit is never
// exceeded, whatever the number of instances. For an inline TOKENBUCKET,
// FIXEDWINDOW, SLIDING, HASHWINDOW or QUOTA rule with a Global key.
// A zero Batch is DefaultBatch.
func (r Rule) Batched(b Batch) Rule {
	if b == (Batch{}) {
		b = DefaultBatch
	}
	r.batch = &b
	return r
}

// Striped splits a global rule over n keys (2 to MaxStripes; 1: not
// striped), each on its own cluster master, each with limit/n.
func (r Rule) Striped(n int) Rule {
	r.stripes = n
	return r
}

// WithBreaker names the protection loop's breaker that this policy rule's
// stage moves (only policy rules have a stage).
func (r Rule) WithBreaker(name string) Rule {
	r.breaker = name
	return r
}

// Name is the rule's name: in Decision.Rule, the metrics' rule label (a
// policy rule's is its policy's name), the headers.
func (r Rule) Name() string { return r.name }

// Spec is an inline rule's spec (false for a policy rule).
func (r Rule) Spec() (Spec, bool) { return r.spec, r.inline }

// Policy is a policy rule's policy name ("" for an inline rule).
func (r Rule) Policy() string { return r.policy }

// IsGlobal reports a rule with one key for everybody.
func (r Rule) IsGlobal() bool { return r.global }

// BatchSettings is a batched rule's batch (false when it is not batched).
func (r Rule) BatchSettings() (Batch, bool) {
	if r.batch == nil {
		return Batch{}, false
	}
	return *r.batch, true
}

// Stripes is the rule's number of stripes (1: not striped).
func (r Rule) Stripes() int {
	if r.stripes == 0 {
		return 1
	}
	return r.stripes
}

// BreakerName is the breaker a policy rule's stage moves ("" for none).
func (r Rule) BreakerName() string { return r.breaker }

// Key is the limiter key for identity: the global key, or the prefix (name
// + ":" by default) followed by identity.
func (r Rule) Key(identity string) string {
	if r.global {
		return r.key
	}
	if r.prefixed {
		return r.prefix + identity
	}
	return r.name + ":" + identity
}

// label is the rule label of the metrics and deny events: a policy rule's
// policy name, else the rule's name.
func (r Rule) label() string {
	if !r.inline && r.policy != "" {
		return r.policy
	}
	return r.name
}

// hashTag is the hash tag of the fixed part of the rule's keys ("api" in
// "{api}:user:"), and whether it has one.
func (r Rule) hashTag() (string, bool) {
	fixed := r.key
	if !r.global {
		fixed = r.name + ":"
		if r.prefixed {
			fixed = r.prefix
		}
	}
	open := strings.IndexByte(fixed, '{')
	if open < 0 {
		return "", false
	}
	end := strings.IndexByte(fixed[open+1:], '}')
	if end <= 0 {
		return "", false
	}
	return fixed[open+1 : open+1+end], true
}

func (r Rule) bad(arg, format string, a ...any) error {
	return &InvalidArgumentError{Rule: r.name, Arg: arg, Reason: fmt.Sprintf(format, a...)}
}

// Validate checks the rule before anything is sent: its name, its spec (as
// the server would), a quota's zone, and the batch and stripe options. The
// error is an *InvalidArgumentError naming the argument at fault.
func (r Rule) Validate() error {
	if r.name == "" || strings.ContainsAny(r.name, "\"\\") || !utf8.ValidString(r.name) {
		return r.bad("name", "must be non-empty UTF-8, without quotes or backslashes")
	}
	if r.inline {
		if err := r.spec.Validate(); err != nil {
			return renameRule(err, r.name)
		}
		if r.spec.Algorithm() == AlgorithmQuota {
			if err := checkZone(r.spec.Zone()); err != nil {
				return renameRule(err, r.name)
			}
		}
	} else {
		p := r.policy
		if p == "" || len(p) > 256 || strings.IndexFunc(p, func(c rune) bool { return c <= ' ' || c > '~' }) >= 0 {
			return r.bad("policy name", "must be 1 to 256 bytes of printable ASCII without spaces")
		}
		if r.global {
			return r.bad("global", "a policy rule cannot be global: its parameters live in the server")
		}
	}
	if r.breaker != "" && r.inline {
		return r.bad("breaker", "only a policy rule has a stage to move a breaker")
	}
	if r.global && r.key == "" {
		return r.bad("key", "a global rule needs a non-empty key")
	}
	return r.checkGrants()
}

// checkGrants checks the batch and stripe options against the rule.
func (r Rule) checkGrants() error {
	grantsOf := func(what string) error {
		const algorithms = "an inline TOKENBUCKET, FIXEDWINDOW, SLIDING, HASHWINDOW or QUOTA rule"
		if !r.inline {
			return r.bad(what, "%s needs %s: a policy's parameters live in the server", what, algorithms)
		}
		switch r.spec.Algorithm() {
		case AlgorithmTokenBucket, AlgorithmFixedWindow, AlgorithmSliding, AlgorithmHashWindow, AlgorithmQuota:
		default:
			return r.bad(what, "%s needs %s, not %s", what, algorithms, r.spec.Algorithm())
		}
		if !r.global {
			return r.bad(what, "%s needs one key for everybody: give it a Global key", what)
		}
		return nil
	}
	if r.batch != nil {
		if err := grantsOf("batched"); err != nil {
			return err
		}
		if r.batch.HoldMs < 1 || r.batch.HoldMs > 60000 {
			return r.bad("hold_ms", "must be an integer from 1 to 60000")
		}
		if r.batch.MaxSharePct < 1 || r.batch.MaxSharePct > 100 {
			return r.bad("max_share_pct", "must be an integer from 1 to 100")
		}
	}
	if n := r.Stripes(); n != 1 {
		if err := grantsOf("striped"); err != nil {
			return err
		}
		if n < 2 || n > MaxStripes {
			return r.bad("striped", "must be an integer from 2 to %d (1: not striped)", MaxStripes)
		}
		smallest := r.spec.params[0]
		if a := r.spec.Algorithm(); a == AlgorithmTokenBucket || a == AlgorithmLeakyBucket {
			smallest = min(smallest, r.spec.params[1])
		}
		if int64(n) > smallest {
			return r.bad("striped", "%d stripes leave a stripe without a unit: every share of the limit (and of a bucket's refill count) must be at least 1, so at most %d", n, smallest)
		}
	}
	return nil
}

// renameRule puts the rule's name in an *InvalidArgumentError.
func renameRule(err error, name string) error {
	if ia, ok := err.(*InvalidArgumentError); ok {
		c := *ia
		c.Rule = name
		return &c
	}
	return err
}

// limitOf is a spec's limit: the capacity or the requests per window.
func limitOf(s Spec) int64 { return s.params[0] }

// shareOf is an instance's part of total: ceil(total * 11 / (instances *
// 10)) for a share by instances, ceil(total * ratio) for a ratio; at least 1
// and at most total.
func shareOf(total int64, instances int64, ratio float64) int64 {
	var part int64
	if ratio > 0 {
		part = ceilTimes(total, ratio)
	} else {
		n := max(instances, 1)
		// total * 11 may overflow for the largest limits: in float then.
		if total <= math.MaxInt64/11 {
			part = (total*11 + n*10 - 1) / (n * 10)
		} else {
			part = int64(math.Ceil(float64(total) * 1.1 / float64(n)))
		}
	}
	return min(max(part, 1), max(total, 1))
}

// localShare is spec at an instance's share: the capacity or limit, and a
// bucket's refill or leak count, scaled; the window or period stays.
func localShare(s Spec, instances int64, ratio float64) Spec {
	out := s
	out.params[0] = shareOf(s.params[0], instances, ratio)
	switch s.Algorithm() {
	case AlgorithmTokenBucket, AlgorithmLeakyBucket:
		out.params[1] = shareOf(s.params[1], instances, ratio)
	}
	return out
}

// ceilTimes is ceil(total * ratio) in integers, ratio read as the shortest
// decimal that is that float64 (0.07, not 0.07000000000000000666): so
// WithShare(0.07) of 100 is 7, where the float product 7.000000000000001
// would round up to 8.
func ceilTimes(total int64, ratio float64) int64 {
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(ratio, 'g', -1, 64))
	if !ok {
		return int64(math.Ceil(float64(total) * ratio))
	}
	r.Mul(r, new(big.Rat).SetInt64(total))
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return q.Int64()
}
