package ratelimit

import (
	"context"
	"fmt"
	"sort"
	"strconv"
)

// PolicyMode is a policy's MODE.
type PolicyMode string

// The modes of RL.POLICY SET.
const (
	// ModeEnforce denies what the limiter denies (the server's default).
	ModeEnforce PolicyMode = "ENFORCE"
	// ModeShadow counts, takes what the limiter admits, always answers
	// allowed.
	ModeShadow PolicyMode = "SHADOW"
	// ModeOff is the kill switch: allowed at once, no state touched.
	ModeOff PolicyMode = "OFF"
)

// Int64 is a pointer to n, for PolicyOptions' optional numbers.
func Int64(n int64) *int64 { return &n }

// Adapt is ADAPT ERRORS pct [FACTOR f] [MIN m] [RECOVER r] [WINDOW ms]
// [MINCALLS n]: after a window with more than Errors % errors, the scale
// drops by Factor % (down to Min); after one with at most half that, it
// climbs by Recover. A nil field is not sent (the server's default:
// FACTOR 80, MIN 50, RECOVER 5, MINCALLS 100, WINDOW 10000).
type Adapt struct {
	Errors   int64  // ERRORS, 0 to 100
	Factor   *int64 // FACTOR, 1 to 100
	Min      *int64 // MIN, 1 to 100
	Recover  *int64 // RECOVER, 0 to 100
	WindowMs *int64 // WINDOW, 1 to 86,400,000
	MinCalls *int64 // MINCALLS, 0 to 2^40
}

// Stages is STAGES degrade_pct break_pct: the stage a window's deny ratio
// puts the policy in (0 to 100, break at least degrade).
type Stages struct {
	DegradePct int64
	BreakPct   int64
}

// PolicyOptions are RL.POLICY SET's options; the zero value sends none.
type PolicyOptions struct {
	// Mode: "" sends none (ENFORCE).
	Mode PolicyMode
	// Rollout is the percentage of keys enforced (0 to 100); nil sends
	// none (100).
	Rollout *int64
	// Adapt turns the protection loop's adaptation on; AdaptOff sends
	// ADAPT OFF (which keeps the scale the policy had). Not both.
	Adapt    *Adapt
	AdaptOff bool
	// Stages sets the stage thresholds.
	Stages *Stages
	// WindowMs is the loop's window (WINDOW ms, 1 to 86,400,000), when not
	// given inside Adapt.
	WindowMs *int64
}

// maxLoopWindowMs is the longest protection-loop window.
const maxLoopWindowMs = 86_400_000

// within checks one protection argument against its range, named as the
// server names it.
func within(rule, name string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return &InvalidArgumentError{Rule: rule, Arg: name, Reason: rangeReason(name, lo, hi)}
	}
	return nil
}

// args checks the options against the contract's protection.arguments
// and answers their words.
func (o PolicyOptions) args(name string) ([]any, error) {
	var out []any
	switch o.Mode {
	case "":
	case ModeEnforce, ModeShadow, ModeOff:
		out = append(out, "MODE", string(o.Mode))
	default:
		return nil, &InvalidArgumentError{Rule: name, Arg: "MODE", Reason: fmt.Sprintf("MODE must be ENFORCE, SHADOW or OFF, not %q", string(o.Mode))}
	}
	if o.Rollout != nil {
		if err := within(name, "ROLLOUT", *o.Rollout, 0, 100); err != nil {
			return nil, err
		}
		out = append(out, "ROLLOUT", strconv.FormatInt(*o.Rollout, 10))
	}
	if o.Adapt != nil && o.AdaptOff {
		return nil, &InvalidArgumentError{Rule: name, Arg: "ADAPT", Reason: "ADAPT ERRORS and ADAPT OFF cannot both be given"}
	}
	if a := o.Adapt; a != nil {
		if err := within(name, "ERRORS", a.Errors, 0, 100); err != nil {
			return nil, err
		}
		out = append(out, "ADAPT", "ERRORS", strconv.FormatInt(a.Errors, 10))
		for _, f := range []struct {
			word   string
			v      *int64
			lo, hi int64
		}{
			{"FACTOR", a.Factor, 1, 100}, {"MIN", a.Min, 1, 100}, {"RECOVER", a.Recover, 0, 100},
			{"WINDOW", a.WindowMs, 1, maxLoopWindowMs}, {"MINCALLS", a.MinCalls, 0, MaxParam},
		} {
			if f.v == nil {
				continue
			}
			if err := within(name, f.word, *f.v, f.lo, f.hi); err != nil {
				return nil, err
			}
			out = append(out, f.word, strconv.FormatInt(*f.v, 10))
		}
	}
	if o.AdaptOff {
		out = append(out, "ADAPT", "OFF")
	}
	if s := o.Stages; s != nil {
		if err := within(name, "degrade_pct", s.DegradePct, 0, 100); err != nil {
			return nil, err
		}
		if err := within(name, "break_pct", s.BreakPct, s.DegradePct, 100); err != nil {
			return nil, err
		}
		out = append(out, "STAGES", strconv.FormatInt(s.DegradePct, 10), strconv.FormatInt(s.BreakPct, 10))
	}
	if o.WindowMs != nil {
		if o.Adapt != nil && o.Adapt.WindowMs != nil {
			return nil, &InvalidArgumentError{Rule: name, Arg: "WINDOW", Reason: "WINDOW given twice (in Adapt and in WindowMs)"}
		}
		if err := within(name, "WINDOW", *o.WindowMs, 1, maxLoopWindowMs); err != nil {
			return nil, err
		}
		out = append(out, "WINDOW", strconv.FormatInt(*o.WindowMs, 10))
	}
	return out, nil
}

// policySetArgs checks and builds RL.POLICY SET name <spec> [options]: a
// quota's zone other than UTC goes among the options (TZ zone).
func policySetArgs(name string, spec Spec, o PolicyOptions) ([]any, error) {
	if err := checkPolicyName("RL.POLICY SET", name); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	opts, err := o.args(name)
	if err != nil {
		return nil, err
	}
	args := append([]any{"RL.POLICY", "SET", name, string(spec.algorithm)}, spec.paramArgs()...)
	if spec.algorithm == AlgorithmQuota && !zoneIsUTC(spec.zone) {
		args = append(args, "TZ", spec.zone)
	}
	return append(args, opts...), nil
}

// PolicySet is RL.POLICY SET name <spec> [MODE] [ROLLOUT] [TZ] [ADAPT ...]
// [STAGES ...] [WINDOW ...], on every master (policies are node state).
// The name (1 to 256 bytes of printable ASCII without spaces), the spec
// and every option are checked first, naming the argument as the server
// does (ERRORS, FACTOR, MIN, RECOVER, MINCALLS, WINDOW, degrade_pct,
// break_pct, ROLLOUT, MODE).
func (c *Client) PolicySet(ctx context.Context, name string, spec Spec, o PolicyOptions) error {
	args, err := policySetArgs(name, spec, o)
	if err != nil {
		return err
	}
	replies, err := c.onMasters(ctx, c.deadline, args...)
	if err != nil {
		return err
	}
	for _, r := range replies {
		if s, _ := r.(string); s != "OK" {
			return fmt.Errorf("%w: RL.POLICY SET answered %s", ErrProtocol, describe(r))
		}
	}
	return nil
}

// PolicyInfo is RL.POLICY GET's answer.
type PolicyInfo struct {
	Name string
	// Spec is the policy's rule (the zero Spec for an algorithm this kit
	// does not know; see Algorithm and Params).
	Spec Spec
	// Algorithm and Params are as the server answered them (a quota's
	// period as its index).
	Algorithm string
	Params    []int64
	// Zone is a quota policy's time zone ("" for UTC).
	Zone string
	// Mode is ENFORCE, SHADOW or OFF.
	Mode PolicyMode
	// Rollout is the percentage of keys enforced.
	Rollout int64
	// Calls, Admitted, Denied and ShadowDenied are the server's counters.
	Calls, Admitted, Denied, ShadowDenied int64
	// Adapt, Stages and WindowMs are the protection loop's settings, when
	// set (nil otherwise).
	Adapt    *Adapt
	Stages   *Stages
	WindowMs *int64
	// Scale is the percentage its size and rate parameters run at (100
	// unless lowered); Stage 0 normal, 1 degrade, 2 break.
	Scale int64
	Stage int64
}

// PolicyGet is RL.POLICY GET name: the policy and its counters, or nil
// when there is none (read on one master).
func (c *Client) PolicyGet(ctx context.Context, name string) (*PolicyInfo, error) {
	if err := checkPolicyName("RL.POLICY GET", name); err != nil {
		return nil, err
	}
	v, err := c.exec(ctx, c.s.rdb, c.deadline, 0, "RL.POLICY", "GET", name)
	if err != nil || v == nil {
		return nil, err
	}
	return parsePolicyInfo(name, v)
}

// parsePolicyInfo reads RL.POLICY GET's field/value pairs by name (the
// contract's get_fields).
func parsePolicyInfo(name string, v any) (*PolicyInfo, error) {
	f := pairs(v)
	if f == nil {
		return nil, fmt.Errorf("%w: RL.POLICY GET answered %s", ErrProtocol, describe(v))
	}
	bad := func(field string) error {
		return fmt.Errorf("%w: RL.POLICY GET: field %s is %s", ErrProtocol, field, describe(f[field]))
	}
	info := &PolicyInfo{Name: name, Scale: 100}
	for _, k := range []string{"name", "algorithm", "params", "mode", "rollout", "calls", "admitted", "denied", "shadow_denied"} {
		if _, ok := f[k]; !ok {
			return nil, fmt.Errorf("%w: RL.POLICY GET has no %s", ErrProtocol, k)
		}
	}
	if s, ok := f["name"].(string); ok {
		info.Name = s
	}
	var ok bool
	if info.Algorithm, ok = f["algorithm"].(string); !ok {
		return nil, bad("algorithm")
	}
	ps, ok := f["params"].([]any)
	if !ok {
		return nil, bad("params")
	}
	for _, p := range ps {
		switch t := p.(type) {
		case int64:
			info.Params = append(info.Params, t)
		case string:
			if per, ok := parsePeriod(t); ok {
				info.Params = append(info.Params, int64(per))
			} else if n, err := strconv.ParseInt(t, 10, 64); err == nil {
				info.Params = append(info.Params, n)
			} else {
				return nil, bad("params")
			}
		default:
			return nil, bad("params")
		}
	}
	mode, _ := f["mode"].(string)
	info.Mode = PolicyMode(mode)
	if z, ok := f["zone"].(string); ok && !zoneIsUTC(z) {
		info.Zone = z
	}
	ints := map[string]*int64{"rollout": &info.Rollout, "calls": &info.Calls, "admitted": &info.Admitted,
		"denied": &info.Denied, "shadow_denied": &info.ShadowDenied, "scale": &info.Scale, "stage": &info.Stage}
	for k, dst := range ints {
		if x, present := f[k]; present {
			n, ok := x.(int64)
			if !ok {
				return nil, bad(k)
			}
			*dst = n
		}
	}
	if x, present := f["window_ms"]; present {
		n, ok := x.(int64)
		if !ok {
			return nil, bad("window_ms")
		}
		info.WindowMs = &n
	}
	if x, present := f["adapt"]; present {
		// ERRORS, FACTOR, MIN, RECOVER, MINCALLS, in order.
		n, ok := intList(x, 5)
		if !ok {
			return nil, bad("adapt")
		}
		info.Adapt = &Adapt{Errors: n[0], Factor: Int64(n[1]), Min: Int64(n[2]), Recover: Int64(n[3]), MinCalls: Int64(n[4])}
	}
	if x, present := f["stages"]; present {
		// degrade, break.
		n, ok := intList(x, 2)
		if !ok {
			return nil, bad("stages")
		}
		info.Stages = &Stages{DegradePct: n[0], BreakPct: n[1]}
	}
	if spec, err := specFromWire(info.Algorithm, info.Params, info.Zone); err == nil {
		info.Spec = spec
	}
	return info, nil
}

// PolicyDel is RL.POLICY DEL name on every master: whether it existed on
// any.
func (c *Client) PolicyDel(ctx context.Context, name string) (bool, error) {
	if err := checkPolicyName("RL.POLICY DEL", name); err != nil {
		return false, err
	}
	replies, err := c.onMasters(ctx, c.deadline, "RL.POLICY", "DEL", name)
	if err != nil {
		return false, err
	}
	existed := false
	for _, r := range replies {
		n, ok := r.(int64)
		if !ok {
			return false, fmt.Errorf("%w: RL.POLICY DEL answered %s", ErrProtocol, describe(r))
		}
		existed = existed || n > 0
	}
	return existed, nil
}

// PolicyList is RL.POLICY LIST: the names, sorted (of every master, in a
// cluster).
func (c *Client) PolicyList(ctx context.Context) ([]string, error) {
	replies, err := c.onMasters(ctx, c.deadline, "RL.POLICY", "LIST")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	names := []string{}
	for _, r := range replies {
		items, ok := r.([]any)
		if !ok {
			return nil, fmt.Errorf("%w: RL.POLICY LIST answered %s", ErrProtocol, describe(r))
		}
		for _, it := range items {
			s, ok := it.(string)
			if !ok {
				return nil, fmt.Errorf("%w: RL.POLICY LIST answered %s", ErrProtocol, describe(r))
			}
			if !seen[s] {
				seen[s] = true
				names = append(names, s)
			}
		}
	}
	sort.Strings(names)
	return names, nil
}

// WindowCounts is one window's counts in RL.POLICY STATS (the contract's
// window_fields).
type WindowCounts struct {
	Calls, Admitted, Denied, OK, Errors uint64
	// DenyPermille is denied x 1000 / calls, ErrorPermille errors x 1000 /
	// (ok + errors), rounded down (0 when nothing was counted).
	DenyPermille, ErrorPermille uint64
}

// WindowFields are the names of a window's fields, in the server's order.
var WindowFields = []string{"calls", "admitted", "denied", "ok", "errors", "deny_permille", "error_permille"}

// StatsFields are the names of RL.POLICY STATS' fields, in the server's
// order.
var StatsFields = []string{"scale", "stage", "window_ms", "window_end_ms", "current", "last", "adapting"}

// PolicyStats is RL.POLICY STATS name (and RL.OUTCOME's answer) from one
// master.
type PolicyStats struct {
	// Scale is the percentage the size and rate parameters run at (1 to
	// 100); Stage 0 normal, 1 degrade, 2 break.
	Scale int
	Stage int
	// WindowMs is the loop's window; WindowEndMs when the current one ends
	// (Unix ms, the master's clock).
	WindowMs    int64
	WindowEndMs int64
	// Current is the window under way, Last the last one that ended.
	Current WindowCounts
	Last    WindowCounts
	// Adapting: ADAPT ERRORS is on.
	Adapting bool
}

// parseWindow reads a window's counts: every one of WindowFields, each a
// count.
func parseWindow(what string, v any) (WindowCounts, error) {
	f := pairs(v)
	if f == nil {
		return WindowCounts{}, fmt.Errorf("%w: %s: a window is %s", ErrProtocol, what, describe(v))
	}
	var out [7]uint64
	for i, k := range WindowFields {
		n, ok := f[k].(int64)
		if !ok || n < 0 {
			return WindowCounts{}, fmt.Errorf("%w: %s: window field %s is %s", ErrProtocol, what, k, describe(f[k]))
		}
		out[i] = uint64(n)
	}
	return WindowCounts{out[0], out[1], out[2], out[3], out[4], out[5], out[6]}, nil
}

// parsePolicyStats reads one master's RL.POLICY STATS reply: every one of
// StatsFields (a field missing, or of the wrong type or range, is an
// error wrapping ErrProtocol; a field this kit does not know is skipped).
func parsePolicyStats(what string, v any) (PolicyStats, error) {
	f := pairs(v)
	if f == nil {
		return PolicyStats{}, fmt.Errorf("%w: %s answered %s", ErrProtocol, what, describe(v))
	}
	num := func(k string, lo, hi int64) (int64, error) {
		n, ok := f[k].(int64)
		if !ok || n < lo || n > hi {
			return 0, fmt.Errorf("%w: %s: %s is %s", ErrProtocol, what, k, describe(f[k]))
		}
		return n, nil
	}
	var s PolicyStats
	scale, err := num("scale", 1, 100)
	if err != nil {
		return s, err
	}
	stage, err := num("stage", 0, 2)
	if err != nil {
		return s, err
	}
	if s.WindowMs, err = num("window_ms", 0, 1<<62); err != nil {
		return s, err
	}
	if s.WindowEndMs, err = num("window_end_ms", 0, 1<<62); err != nil {
		return s, err
	}
	adapting, err := num("adapting", 0, 1)
	if err != nil {
		return s, err
	}
	if s.Current, err = parseWindow(what, f["current"]); err != nil {
		return s, err
	}
	if s.Last, err = parseWindow(what, f["last"]); err != nil {
		return s, err
	}
	s.Scale, s.Stage, s.Adapting = int(scale), int(stage), adapting == 1
	return s, nil
}

// eachMasterStats sends a command answered as RL.POLICY STATS to every
// master: each master's answer. A master that errors (ERR unknown policy)
// or cannot be reached fails the whole call.
func (c *Client) eachMasterStats(ctx context.Context, what string, args ...any) ([]PolicyStats, error) {
	replies, err := c.onMasters(ctx, c.deadline, args...)
	if err != nil {
		return nil, err
	}
	out := make([]PolicyStats, 0, len(replies))
	for _, r := range replies {
		s, err := parsePolicyStats(what, r)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// PolicyStats is RL.POLICY STATS name on every master (the one server, or
// each master of a cluster): each master's answer.
func (c *Client) PolicyStats(ctx context.Context, name string) ([]PolicyStats, error) {
	if err := checkPolicyName("RL.POLICY STATS", name); err != nil {
		return nil, err
	}
	return c.eachMasterStats(ctx, "RL.POLICY STATS", "RL.POLICY", "STATS", name)
}

// PolicyScale is RL.POLICY SCALE name pct (1 to 100) on every master: the
// operator's switch that degrades a limit at once.
func (c *Client) PolicyScale(ctx context.Context, name string, pct int64) error {
	if err := checkPolicyName("RL.POLICY SCALE", name); err != nil {
		return err
	}
	if err := within(name, "pct", pct, 1, 100); err != nil {
		return err
	}
	replies, err := c.onMasters(ctx, c.deadline, "RL.POLICY", "SCALE", name, strconv.FormatInt(pct, 10))
	if err != nil {
		return err
	}
	for _, r := range replies {
		if s, _ := r.(string); s != "OK" {
			return fmt.Errorf("%w: RL.POLICY SCALE answered %s", ErrProtocol, describe(r))
		}
	}
	return nil
}

// Outcome is RL.OUTCOME name ok errors on every master, so that each sees
// the same totals: each master's answer (as PolicyStats). Never retried: a
// report lost is a count lost.
func (c *Client) Outcome(ctx context.Context, name string, ok, errs uint64) ([]PolicyStats, error) {
	return c.OutcomeDenied(ctx, name, ok, errs, 0)
}

// OutcomeDenied is RL.OUTCOME name ok errors DENIED n: also denied calls of
// the policy that the kit denied without asking the server (its deny
// cache, its local level). DENIED is sent only when n > 0. Each number is
// 0 to 2^40 (an *InvalidArgumentError naming ok, errors or DENIED).
func (c *Client) OutcomeDenied(ctx context.Context, name string, ok, errs, denied uint64) ([]PolicyStats, error) {
	args, err := outcomeArgs(name, ok, errs, denied)
	if err != nil {
		return nil, err
	}
	return c.eachMasterStats(ctx, "RL.OUTCOME", args...)
}

// outcomeArgs checks and builds RL.OUTCOME name ok errors [DENIED n].
func outcomeArgs(name string, ok, errs, denied uint64) ([]any, error) {
	if err := checkPolicyName("RL.OUTCOME", name); err != nil {
		return nil, err
	}
	for _, a := range []struct {
		name string
		v    uint64
	}{{"ok", ok}, {"errors", errs}, {"DENIED", denied}} {
		if a.v > uint64(MaxParam) {
			return nil, &InvalidArgumentError{Rule: name, Arg: a.name, Reason: rangeReason(a.name, 0, MaxParam)}
		}
	}
	args := []any{"RL.OUTCOME", name, strconv.FormatUint(ok, 10), strconv.FormatUint(errs, 10)}
	if denied > 0 {
		args = append(args, "DENIED", strconv.FormatUint(denied, 10))
	}
	return args, nil
}

// LogEntry is one entry of RL.LOG GET.
type LogEntry struct {
	// ID grows by one per denial logged.
	ID int64
	// UnixMs is when, in Unix milliseconds.
	UnixMs int64
	// Key is the limiter key (cut to 128 bytes).
	Key string
	// Source is the command, "policy:<name>", or "RL.ALL <ALGORITHM>".
	Source string
	// Cost is the units asked; WaitMs the denial's wait.
	Cost   int64
	WaitMs int64
}

// LogGet is RL.LOG GET count: the most recent enforced denials, newest
// first (of every master, in a cluster, merged newest first). count is 1
// to 2^40.
func (c *Client) LogGet(ctx context.Context, count int64) ([]LogEntry, error) {
	if err := within("RL.LOG GET", "count", count, 1, MaxParam); err != nil {
		return nil, err
	}
	replies, err := c.onMasters(ctx, c.deadline, "RL.LOG", "GET", strconv.FormatInt(count, 10))
	if err != nil {
		return nil, err
	}
	var out []LogEntry
	for _, r := range replies {
		items, ok := r.([]any)
		if !ok {
			return nil, fmt.Errorf("%w: RL.LOG GET answered %s", ErrProtocol, describe(r))
		}
		for _, it := range items {
			e, err := parseLogEntry(it)
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].UnixMs > out[j].UnixMs })
	if int64(len(out)) > count {
		out = out[:count]
	}
	return out, nil
}

func parseLogEntry(v any) (LogEntry, error) {
	f, ok := v.([]any)
	bad := fmt.Errorf("%w: RL.LOG GET entry %s", ErrProtocol, describe(v))
	if !ok || len(f) < 6 {
		return LogEntry{}, bad
	}
	var e LogEntry
	var ok1, ok2, ok3, ok4, ok5, ok6 bool
	e.ID, ok1 = f[0].(int64)
	e.UnixMs, ok2 = f[1].(int64)
	e.Key, ok3 = f[2].(string)
	e.Source, ok4 = f[3].(string)
	e.Cost, ok5 = f[4].(int64)
	e.WaitMs, ok6 = f[5].(int64)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return LogEntry{}, bad
	}
	return e, nil
}

// LogLen is RL.LOG LEN (summed over the masters of a cluster).
func (c *Client) LogLen(ctx context.Context) (int64, error) {
	replies, err := c.onMasters(ctx, c.deadline, "RL.LOG", "LEN")
	if err != nil {
		return 0, err
	}
	var total int64
	for _, r := range replies {
		n, ok := r.(int64)
		if !ok {
			return 0, fmt.Errorf("%w: RL.LOG LEN answered %s", ErrProtocol, describe(r))
		}
		total += n
	}
	return total, nil
}

// LogReset is RL.LOG RESET on every master.
func (c *Client) LogReset(ctx context.Context) error {
	_, err := c.onMasters(ctx, c.deadline, "RL.LOG", "RESET")
	return err
}

// intList reads a list of n integers.
func intList(v any, n int) ([]int64, bool) {
	items, ok := v.([]any)
	if !ok || len(items) != n {
		return nil, false
	}
	out := make([]int64, n)
	for i, it := range items {
		if out[i], ok = it.(int64); !ok {
			return nil, false
		}
	}
	return out, true
}
