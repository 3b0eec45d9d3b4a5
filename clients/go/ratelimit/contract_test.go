package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// The client's part of the contract (clients/contract/contract.json):
// validation, options, replies, grants' requests and replies, zones where
// they concern validation, protection.arguments and the stats' fields;
// each checked in the kit without a server, and its samples sent to a real
// server to check the server's words.

type ctCase struct {
	Params  []int64 `json:"params"`
	OK      bool    `json:"ok"`
	Names   string  `json:"names"`
	Message string  `json:"message"`
}

type ctAlgorithm struct {
	Word    string `json:"word"`
	Command string `json:"command"`
	Params  []struct {
		Name     string   `json:"name"`
		Min      int64    `json:"min"`
		Max      int64    `json:"max"`
		Keywords []string `json:"keywords"`
	} `json:"params"`
	Validation []ctCase `json:"validation"`
}

type ctRequestCase struct {
	Args    []string         `json:"args"`
	OK      bool             `json:"ok"`
	Names   string           `json:"names"`
	Message string           `json:"message"`
	Request map[string]int64 `json:"request"`
}

type ctWords struct {
	Args    []string `json:"args"`
	Message string   `json:"message"`
}

type ctReply struct {
	Command string          `json:"command"`
	Fields  json.RawMessage `json:"fields"`
}

type ctContract struct {
	MaxParam       int64         `json:"max_param"`
	MaxSpanMs      int64         `json:"max_span_ms"`
	DecisionFields []string      `json:"decision_fields"`
	Algorithms     []ctAlgorithm `json:"algorithms"`
	Options        struct {
		Words []struct {
			Word string `json:"word"`
			Min  *int64 `json:"min"`
			Max  *int64 `json:"max"`
		} `json:"words"`
		Requests []ctRequestCase `json:"requests"`
		Blocks   []struct {
			Args    []string `json:"args"`
			BlockMs int64    `json:"block_ms"`
			OK      bool     `json:"ok"`
			Names   string   `json:"names"`
			Message string   `json:"message"`
		} `json:"blocks"`
		RefusedWords []ctWords `json:"refused_words"`
	} `json:"options"`
	Replies []ctReply `json:"replies"`
	Zones   struct {
		Accepted            []string `json:"accepted"`
		Refused             []string `json:"refused"`
		RefusedByServerOnly []string `json:"refused_by_server_only"`
	} `json:"zones"`
	Periods []struct {
		Word  string `json:"word"`
		Index int    `json:"index"`
	} `json:"periods"`
	Grants struct {
		Commands        []string `json:"commands"`
		RefusedCommands []struct {
			Command string `json:"command"`
			Message string `json:"message"`
			Policy  string `json:"policy"`
			Spec    int    `json:"spec"`
		} `json:"refused_commands"`
		Requests     []ctRequestCase `json:"requests"`
		RefusedWords []ctWords       `json:"refused_words"`
		Replies      []ctReply       `json:"replies"`
	} `json:"grants"`
	Protection struct {
		Arguments []struct {
			Name string          `json:"name"`
			Min  int64           `json:"min"`
			Max  json.RawMessage `json:"max"`
		} `json:"arguments"`
		StatsFields  []string `json:"stats_fields"`
		WindowFields []string `json:"window_fields"`
		GetFields    struct {
			Always  []string `json:"always"`
			WhenSet []string `json:"when_set"`
			Then    []string `json:"then"`
		} `json:"get_fields"`
	} `json:"protection"`
}

func ctLoadContract(t *testing.T) *ctContract {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c ctContract
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c.checked(t)
}

func (c *ctContract) checked(t *testing.T) *ctContract {
	t.Helper()
	if len(c.Algorithms) != 7 || len(c.Options.Requests) == 0 || len(c.Replies) == 0 || len(c.Grants.Requests) == 0 ||
		len(c.Protection.Arguments) == 0 || len(c.Zones.Accepted) == 0 {
		t.Fatalf("the contract file lacks a section the client's conformance reads")
	}
	return c
}

// ctSpec builds a spec through the kit's constructors, as a user would.
func ctSpec(word string, p []int64) Spec {
	at := func(i int) int64 {
		if i < len(p) {
			return p[i]
		}
		return 0
	}
	switch Algorithm(word) {
	case AlgorithmTokenBucket:
		return TokenBucket(at(0), at(1), at(2))
	case AlgorithmLeakyBucket:
		return LeakyBucket(at(0), at(1), at(2))
	case AlgorithmFixedWindow:
		return FixedWindow(at(0), at(1))
	case AlgorithmSliding:
		return SlidingWindow(at(0), at(1))
	case AlgorithmHashWindow:
		return HashWindow(at(0), at(1), at(2))
	case AlgorithmQuota:
		return QuotaSpec(at(0), Period(at(1)), "")
	case AlgorithmConcurrency:
		return ConcurrencySpec(at(0), at(1))
	}
	return Spec{}
}

// ctSample is a valid spec of the algorithm, with a limit of 10.
func ctSample(word string) Spec {
	if word == "QUOTA" {
		return QuotaSpec(10, PeriodDay, "")
	}
	return ctSpec(word, []int64{10, 1000, 1000})
}

// ctRefusal checks err against a refused case: an *InvalidArgumentError
// naming names, whose reason is the server's message (without "ERR ").
func ctRefusal(t *testing.T, what string, err error, names, message string) {
	t.Helper()
	var ia *InvalidArgumentError
	if !errors.As(err, &ia) {
		t.Fatalf("%s: want a refusal naming %s, got %v", what, names, err)
	}
	if ia.Arg != names || ia.Reason != strings.TrimPrefix(message, "ERR ") {
		t.Fatalf("%s: refused naming %q (%q), want %q (%q)", what, ia.Arg, ia.Reason, names, message)
	}
}

// TestContractValidation: every algorithms[].validation case accepted or
// refused by Spec.Validate naming the same parameter with the server's
// words; the parameters' names, ranges and periods as the kit has them.
func TestContractValidation(t *testing.T) {
	c := ctLoadContract(t)
	if c.MaxParam != MaxParam || c.MaxSpanMs != MaxSpanMs {
		t.Fatalf("max_param %d, max_span_ms %d", c.MaxParam, c.MaxSpanMs)
	}
	if strings.Join(c.DecisionFields, ",") != "allowed,limit,remaining,wait_ms,reset_ms" {
		t.Fatalf("decision_fields %v", c.DecisionFields)
	}
	n := 0
	for _, a := range c.Algorithms {
		if Algorithm(a.Word).Command() != a.Command {
			t.Fatalf("%s's command %s", a.Word, a.Command)
		}
		ps := paramsOf(Algorithm(a.Word))
		if len(ps) != len(a.Params) {
			t.Fatalf("%s has %d parameters in the kit, %d in the contract", a.Word, len(ps), len(a.Params))
		}
		for i, p := range a.Params {
			if ps[i] != (param{p.Name, p.Min, p.Max}) {
				t.Fatalf("%s parameter %d: kit %+v, contract %+v", a.Word, i, ps[i], p)
			}
			for k, w := range p.Keywords {
				if Period(k).String() != w {
					t.Fatalf("%s keyword %d: %s, the kit's %s", a.Word, k, w, Period(k))
				}
			}
		}
		for i, v := range a.Validation {
			what := fmt.Sprintf("%s validation %d %v", a.Word, i, v.Params)
			err := ctSpec(a.Word, v.Params).Validate()
			if v.OK {
				if err != nil {
					t.Fatalf("%s: refused: %v", what, err)
				}
			} else {
				ctRefusal(t, what, err, v.Names, v.Message)
			}
			n++
		}
	}
	for _, p := range c.Periods {
		if Period(p.Index).String() != p.Word {
			t.Fatalf("period %d is %s, the kit's %s", p.Index, p.Word, Period(p.Index))
		}
	}
	if n < 80 {
		t.Fatalf("only %d validation cases", n)
	}
}

// TestContractZones: zones accepted and refused on syntax alone, as every
// kit does; a zone only the server refuses passes the kit.
func TestContractZones(t *testing.T) {
	c := ctLoadContract(t)
	for _, z := range append(append([]string(nil), c.Zones.Accepted...), c.Zones.RefusedByServerOnly...) {
		if err := ValidZone(z); err != nil {
			t.Fatalf("zone %q refused: %v", z, err)
		}
		if err := QuotaSpec(10, PeriodDay, z).Validate(); err != nil {
			t.Fatalf("a quota in %q refused: %v", z, err)
		}
	}
	for _, z := range c.Zones.Refused {
		err := ValidZone(z)
		var ia *InvalidArgumentError
		if !errors.As(err, &ia) || ia.Arg != "zone" {
			t.Fatalf("zone %q: want a refusal naming zone, got %v", z, err)
		}
		if z == "" {
			continue // QuotaSpec's "" is UTC, by the kit's convention
		}
		err = QuotaSpec(10, PeriodDay, z).Validate()
		if !errors.As(err, &ia) || ia.Arg != "zone" {
			t.Fatalf("a quota in %q: want a refusal naming zone, got %v", z, err)
		}
	}
}

// ctBuild builds a tagged request through the kit's Request type; ok is
// false for a value its types cannot hold (below 0: refused by
// construction).
func ctBuild(r map[string]int64) (Request, bool) {
	for kind, n := range r {
		if n < 0 {
			return Request{}, false
		}
		switch kind {
		case "cost":
			return Cost(uint64(n)), true
		case "force":
			return Force(uint64(n)), true
		case "refund":
			return Refund(uint64(n)), true
		case "upto":
			return UpTo(uint64(n)), true
		}
	}
	panic(fmt.Sprintf("unknown request %v", r))
}

func ctStrings(args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = fmt.Sprint(a)
	}
	return out
}

// ctRequests checks options.requests (and grants.requests): each built
// with the kit's Request, accepted or refused naming the same option, with
// the args the server receives.
func ctRequests(t *testing.T, cases []ctRequestCase) int {
	n := 0
	for i, rc := range cases {
		what := fmt.Sprintf("request %d %v", i, rc.Request)
		req, ok := ctBuild(rc.Request)
		if !ok {
			continue
		}
		err := checkRequest("RL.TOKENBUCKET", req)
		if rc.OK {
			if err != nil {
				t.Fatalf("%s: refused: %v", what, err)
			}
		} else {
			ctRefusal(t, what, err, rc.Names, rc.Message)
		}
		if got := ctStrings(requestArgs(req)); !reflect.DeepEqual(got, rc.Args) {
			t.Fatalf("%s: args %v, want %v", what, got, rc.Args)
		}
		n++
	}
	return n
}

// TestContractOptions: options' words, requests and blocks in the kit;
// refused_words that no request of the kit builds.
func TestContractOptions(t *testing.T) {
	c := ctLoadContract(t)
	for _, w := range c.Options.Words {
		if w.Max != nil && *w.Max != MaxParam {
			t.Fatalf("%s's max %d", w.Word, *w.Max)
		}
	}
	if n := ctRequests(t, c.Options.Requests); n < 10 {
		t.Fatalf("only %d request cases", n)
	}
	for i, b := range c.Options.Blocks {
		what := fmt.Sprintf("block %d (%d ms)", i, b.BlockMs)
		// The kit's BLOCK is a time.Duration: whole milliseconds pass as they are.
		ms := blockMs(time.Duration(b.BlockMs) * time.Millisecond)
		if ms != b.BlockMs {
			t.Fatalf("%s: %d ms after the Duration", what, ms)
		}
		args, err := blockArgs(ms)
		if b.OK {
			if err != nil || !reflect.DeepEqual(ctStrings(args), b.Args) {
				t.Fatalf("%s: %v %v, want %v", what, args, err, b.Args)
			}
		} else {
			ctRefusal(t, what, err, b.Names, b.Message)
		}
	}
	if blockMs(time.Microsecond) != 1 || blockMs(1500*time.Microsecond) != 2 {
		t.Fatal("a wait is rounded up to whole milliseconds")
	}
	for _, w := range append(append([]ctWords(nil), c.Options.RefusedWords...), c.Grants.RefusedWords...) {
		for _, req := range ctAllRequests(w.Args) {
			if reflect.DeepEqual(ctStrings(requestArgs(req)), w.Args) {
				t.Fatalf("the kit builds the refused words %v", w.Args)
			}
		}
	}
}

// ctAllRequests are the requests of every kind on the numbers in args.
func ctAllRequests(args []string) []Request {
	out := []Request{{}}
	for _, a := range args {
		if n, err := strconv.ParseUint(a, 10, 64); err == nil {
			out = append(out, Cost(n), Force(n), Refund(n), UpTo(n))
		}
	}
	return out
}

// ctSixthFor is the reply shape the kit reads for a command of the
// contract's replies.
func ctSixthFor(command string, upto bool) []sixth {
	switch {
	case command == "RL.ALL" && upto:
		return []sixth{sixthDeniedByGranted}
	case command == "RL.ALL":
		return []sixth{sixthDeniedBy}
	case upto:
		return []sixth{sixthGranted}
	case command == "RL.CONCURRENCY":
		return []sixth{sixthLease}
	case command == "RL.HIT":
		return []sixth{sixthMaybeLease}
	}
	return []sixth{sixthNone}
}

// TestContractReplies: each command's reply fields read in order (denied_by
// 0-based in the kit; granted with UPTO); a reply of another width, or not
// integers, is ErrProtocol.
func TestContractReplies(t *testing.T) {
	c := ctLoadContract(t)
	check := func(r ctReply, upto bool) {
		var fields []string
		if err := json.Unmarshal(r.Fields, &fields); err != nil {
			// RL.HIT: "as the policy's algorithm" (then granted): five or
			// six (a lease), six with UPTO.
			var words string
			if json.Unmarshal(r.Fields, &words) != nil || r.Command != "RL.HIT" {
				t.Fatalf("%s's fields: %s", r.Command, r.Fields)
			}
			fields = []string{"allowed", "limit", "remaining", "wait_ms", "reset_ms", "lease"}
			if upto {
				fields[5] = "granted"
			}
		}
		for _, s := range ctSixthFor(r.Command, upto) {
			values := []int64{0, 7, 3, 250, 1500, 2, 5}
			reply := make([]any, len(fields))
			for i := range fields {
				reply[i] = values[i]
			}
			d, err := parseDecision(r.Command, reply, s)
			if err != nil {
				t.Fatalf("%s %v: %v", r.Command, fields, err)
			}
			for i, f := range fields {
				var got int64
				switch f {
				case "allowed":
					if d.Allowed {
						got = 1
					}
				case "limit":
					got = d.Limit
				case "remaining":
					got = d.Remaining
				case "wait_ms":
					got = d.WaitMs
					if d.RetryAfter != time.Duration(d.WaitMs)*time.Millisecond {
						t.Fatalf("%s: RetryAfter %v", r.Command, d.RetryAfter)
					}
				case "reset_ms":
					got = d.ResetAfter.Milliseconds()
				case "lease":
					got = int64(d.Lease)
				case "denied_by":
					got = int64(d.DeniedBy) + 1
				case "granted":
					got = d.Granted
				default:
					t.Fatalf("%s: unknown field %s", r.Command, f)
				}
				if got != values[i] {
					t.Fatalf("%s: field %d (%s) read %d, want %d", r.Command, i, f, got, values[i])
				}
			}
			if !upto && d.Granted != -1 {
				t.Fatalf("%s: Granted %d without UPTO", r.Command, d.Granted)
			}
			// Other widths are refused.
			lo, hi := s.widths()
			for _, w := range []int{lo - 1, hi + 1} {
				bad := make([]any, w)
				for i := range bad {
					bad[i] = int64(0)
				}
				if _, err := parseDecision(r.Command, bad, s); !errors.Is(err, ErrProtocol) {
					t.Fatalf("%s: a reply of %d integers: %v", r.Command, w, err)
				}
			}
			reply[1] = "7"
			if _, err := parseDecision(r.Command, reply, s); !errors.Is(err, ErrProtocol) {
				t.Fatalf("%s: a string field: %v", r.Command, err)
			}
		}
	}
	for _, r := range c.Replies {
		check(r, false)
	}
	for _, r := range c.Grants.Replies {
		check(r, true)
	}
	if _, err := parseDecision("x", int64(1), sixthNone); !errors.Is(err, ErrProtocol) {
		t.Fatalf("an integer reply: %v", err)
	}
	if _, err := parseDecision("x", []any{int64(2), int64(1), int64(1), int64(0), int64(0)}, sixthNone); !errors.Is(err, ErrProtocol) {
		t.Fatalf("allowed 2: %v", err)
	}
}

// TestContractGrants: UPTO's requests, the commands that refuse it, in the
// kit's words.
func TestContractGrants(t *testing.T) {
	c := ctLoadContract(t)
	if n := ctRequests(t, c.Grants.Requests); n < 4 {
		t.Fatalf("only %d UPTO cases", n)
	}
	for _, rc := range c.Grants.RefusedCommands {
		switch {
		case rc.Policy != "":
			// The server's to refuse: the kit does not know a policy's algorithm.
		case rc.Spec > 0:
			limits := make([]Limit, rc.Spec)
			for i := range limits {
				limits[i] = Limit{Key: fmt.Sprintf("k%d", i), Spec: FixedWindow(10, 1000)}
			}
			limits[rc.Spec-1].Spec = LeakyBucket(10, 1, 1000)
			_, _, err := (&Client{s: &clientShared{}}).allArgs(limits, UpTo(2))
			ctRefusal(t, rc.Command, err, "UPTO", rc.Message)
		default:
			word := strings.TrimPrefix(rc.Command, "RL.")
			_, err := limiterArgs("k", ctSpec(word, []int64{10, 1, 1000}), UpTo(2))
			ctRefusal(t, rc.Command, err, "UPTO", rc.Message)
		}
	}
	for _, cmd := range c.Grants.Commands {
		word := strings.TrimPrefix(cmd, "RL.")
		if cmd == "RL.HIT" || cmd == "RL.ALL" {
			continue
		}
		if _, err := limiterArgs("k", ctSample(word), UpTo(2)); err != nil {
			t.Fatalf("%s refuses UPTO in the kit: %v", cmd, err)
		}
	}
}

// TestContractProtection: each of protection.arguments accepted at its
// bounds and refused beyond, naming the same argument; the stats' fields.
func TestContractProtection(t *testing.T) {
	c := ctLoadContract(t)
	spec := FixedWindow(10, 1000)
	// check: the argument at v, through the call that takes it.
	check := func(name string, v int64) error {
		o := PolicyOptions{}
		switch name {
		case "ERRORS":
			o.Adapt = &Adapt{Errors: v}
		case "FACTOR":
			o.Adapt = &Adapt{Errors: 10, Factor: Int64(v)}
		case "MIN":
			o.Adapt = &Adapt{Errors: 10, Min: Int64(v)}
		case "RECOVER":
			o.Adapt = &Adapt{Errors: 10, Recover: Int64(v)}
		case "MINCALLS":
			o.Adapt = &Adapt{Errors: 10, MinCalls: Int64(v)}
		case "WINDOW":
			o.WindowMs = Int64(v)
		case "degrade_pct":
			o.Stages = &Stages{DegradePct: v, BreakPct: 100}
		case "break_pct":
			o.Stages = &Stages{DegradePct: 40, BreakPct: v}
		case "pct":
			if err := within("p", "pct", v, 1, 100); err != nil {
				return err
			}
			return nil
		case "ok", "errors", "DENIED":
			if v < 0 {
				return &InvalidArgumentError{Arg: name} // unsigned: refused by construction
			}
			n := map[string]uint64{name: uint64(v)}
			args, err := outcomeArgs("p", n["ok"], n["errors"], n["DENIED"])
			if err == nil && name == "DENIED" && v > 0 && args[len(args)-2] != "DENIED" {
				t.Fatalf("DENIED %d not sent: %v", v, args)
			}
			if err == nil && name == "DENIED" && v == 0 && len(args) != 4 {
				t.Fatalf("DENIED 0 sent: %v", args)
			}
			return err
		default:
			t.Fatalf("unknown protection argument %s", name)
		}
		_, err := policySetArgs("p", spec, o)
		return err
	}
	for _, a := range c.Protection.Arguments {
		max := int64(100)
		if err := json.Unmarshal(a.Max, &max); err != nil {
			// break_pct: "degrade_pct to 100" (degrade 40 in check).
			a.Min, max = 40, 100
		}
		for _, v := range []int64{a.Min, max} {
			if err := check(a.Name, v); err != nil {
				t.Fatalf("%s %d refused: %v", a.Name, v, err)
			}
		}
		for _, v := range []int64{a.Min - 1, max + 1} {
			err := check(a.Name, v)
			var ia *InvalidArgumentError
			if !errors.As(err, &ia) || ia.Arg != a.Name {
				t.Fatalf("%s %d: want a refusal naming %s, got %v", a.Name, v, a.Name, err)
			}
			if ia.Reason != "" && !strings.HasPrefix(ia.Reason, a.Name+" must be an integer from ") {
				t.Fatalf("%s %d: %q", a.Name, v, ia.Reason)
			}
		}
	}
	if !reflect.DeepEqual(c.Protection.StatsFields, StatsFields) || !reflect.DeepEqual(c.Protection.WindowFields, WindowFields) {
		t.Fatalf("stats fields %v / %v, the kit's %v / %v", c.Protection.StatsFields, c.Protection.WindowFields, StatsFields, WindowFields)
	}
	window := func(skip string) []any {
		var out []any
		for i, f := range WindowFields {
			if f != skip {
				out = append(out, f, int64(i))
			}
		}
		return out
	}
	reply := func(skip string) []any {
		var out []any
		for _, f := range StatsFields {
			if f == skip {
				continue
			}
			switch f {
			case "current", "last":
				out = append(out, f, window(""))
			case "scale":
				out = append(out, f, int64(80))
			case "stage", "adapting":
				out = append(out, f, int64(1))
			default:
				out = append(out, f, int64(1000))
			}
		}
		return out
	}
	s, err := parsePolicyStats("STATS", reply(""))
	if err != nil || s.Scale != 80 || s.Stage != 1 || !s.Adapting || s.WindowMs != 1000 || s.Current.ErrorPermille != 6 || s.Last.Admitted != 1 {
		t.Fatalf("a full stats reply: %+v %v", s, err)
	}
	for _, f := range StatsFields {
		if _, err := parsePolicyStats("STATS", reply(f)); !errors.Is(err, ErrProtocol) {
			t.Fatalf("a stats reply without %s: %v", f, err)
		}
	}
	for _, f := range WindowFields {
		r := reply("current")
		r = append(r, "current", window(f))
		if _, err := parsePolicyStats("STATS", r); !errors.Is(err, ErrProtocol) {
			t.Fatalf("a window without %s: %v", f, err)
		}
	}
	// RL.POLICY GET's names: each of always, when_set and then is read.
	get := []any{"name", "p", "algorithm", "FIXEDWINDOW", "params", []any{int64(10), int64(1000)}, "mode", "SHADOW",
		"rollout", int64(30), "calls", int64(5), "admitted", int64(4), "denied", int64(1), "shadow_denied", int64(1),
		"adapt", []any{int64(20), int64(80), int64(50), int64(5), int64(100)}, "stages", []any{int64(30), int64(60)},
		"window_ms", int64(5000), "scale", int64(90), "stage", int64(2)}
	var names []string
	for i := 0; i < len(get); i += 2 {
		names = append(names, get[i].(string))
	}
	g := c.Protection.GetFields
	if want := append(append(append([]string(nil), g.Always...), g.WhenSet...), g.Then...); !reflect.DeepEqual(names, want) {
		t.Fatalf("GET's names %v, contract %v", names, want)
	}
	info, err := parsePolicyInfo("p", get)
	if err != nil || info.Spec != spec || info.Mode != ModeShadow || info.Rollout != 30 || info.Calls != 5 || info.ShadowDenied != 1 ||
		info.Adapt.Errors != 20 || *info.Adapt.MinCalls != 100 || info.Stages.BreakPct != 60 || *info.WindowMs != 5000 || info.Scale != 90 || info.Stage != 2 {
		t.Fatalf("GET read by name: %+v %v", info, err)
	}
}

// TestContractServer sends the client's samples of the contract to a real
// server (Redis 7.0, its configs opened to the contract's bounds): each
// validation case as a COST 0 call (the kit's call accepted, or the
// server's refusal in the contract's words), each zone, each request,
// block and refused word on a token bucket, UPTO's requests and refused
// commands, and the protection arguments' bounds.
func TestContractServer(t *testing.T) {
	c := ctLoadContract(t)
	ctx := context.Background()
	srv := testserver.StartWith(t, testserver.Redis, testserver.Options{Args: []string{
		"--ratelimit.sliding-max-limit", "16777215", "--ratelimit.hashwindow-max-buckets", "1000000"}})
	cl := ctClient(t, srv.Client(), WithDeadline(5*time.Second))
	raw := func(args ...any) error {
		_, err := srv.Do(ctx, args...)
		return err
	}
	wantServer := func(what string, err error, message string) {
		t.Helper()
		if err == nil || err.Error() != message {
			t.Fatalf("%s: the server answered %v, want %q", what, err, message)
		}
	}
	toAny := func(ss []string) []any {
		out := make([]any, len(ss))
		for i, s := range ss {
			out[i] = s
		}
		return out
	}
	key := 0
	next := func() string { key++; return fmt.Sprintf("ct:%d", key) }

	for _, a := range c.Algorithms {
		for i, v := range a.Validation {
			what := fmt.Sprintf("%s validation %d %v", a.Word, i, v.Params)
			spec := ctSpec(a.Word, v.Params)
			if v.OK {
				if _, err := cl.Apply(ctx, next(), spec, Cost(0)); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				continue
			}
			args := []any{a.Command, next()}
			for j, p := range v.Params {
				if a.Word == "QUOTA" && j == 1 && p >= 0 && p <= 3 {
					args = append(args, Period(p).String())
				} else {
					args = append(args, strconv.FormatInt(p, 10))
				}
			}
			if a.Word == "QUOTA" && v.Names == "period" {
				continue // a period the kit cannot name: its index is not a word the server takes
			}
			wantServer(what, raw(append(args, "COST", "0")...), "ERR "+v.Message)
		}
	}
	for _, z := range c.Zones.Accepted {
		if _, err := cl.Quota(ctx, next(), 10, PeriodDay, z, Cost(0)); err != nil {
			t.Fatalf("zone %q: %v", z, err)
		}
	}
	for _, z := range c.Zones.RefusedByServerOnly {
		_, err := cl.Quota(ctx, next(), 10, PeriodDay, z, Cost(0))
		var se *ServerError
		if !errors.As(err, &se) || !strings.Contains(se.Message, z) {
			t.Fatalf("zone %q the server does not know: %v", z, err)
		}
	}
	for _, z := range c.Zones.Refused {
		if z == "" {
			continue
		}
		if err := raw("RL.QUOTA", next(), 10, "DAY", "TZ", z, "COST", "0"); err == nil {
			t.Fatalf("the server takes zone %q", z)
		}
	}
	tb := func(extra []string) error {
		return raw(append([]any{"RL.TOKENBUCKET", next(), "10", "1", "1000"}, toAny(extra)...)...)
	}
	for _, rc := range append(append([]ctRequestCase(nil), c.Options.Requests...), c.Grants.Requests...) {
		what := fmt.Sprintf("request %v", rc.Request)
		if req, ok := ctBuild(rc.Request); ok && rc.OK {
			if _, err := cl.TokenBucket(ctx, next(), 10, 1, 1000, req); err != nil {
				t.Fatalf("%s through the kit: %v", what, err)
			}
		}
		if err := tb(rc.Args); rc.OK != (err == nil) || (!rc.OK && err.Error() != rc.Message) {
			t.Fatalf("%s %v: the server answered %v, want %q", what, rc.Args, err, rc.Message)
		}
	}
	for _, b := range c.Options.Blocks {
		if b.OK && b.BlockMs > 0 {
			d, err := cl.Acquire(ctx, next(), TokenBucket(10, 1, 1000), Cost(0), time.Duration(b.BlockMs)*time.Millisecond)
			if err != nil || !d.Allowed {
				t.Fatalf("block %d: %+v %v", b.BlockMs, d, err)
			}
		}
		args := append([]string{"COST", "0"}, b.Args...)
		if err := tb(args); b.OK != (err == nil) || (!b.OK && err.Error() != b.Message) {
			t.Fatalf("block %v: the server answered %v, want %q", b.Args, err, b.Message)
		}
	}
	for _, w := range append(append([]ctWords(nil), c.Options.RefusedWords...), c.Grants.RefusedWords...) {
		wantServer(fmt.Sprint(w.Args), tb(w.Args), w.Message)
	}
	// UPTO: where it is taken, and where it is refused.
	if err := cl.PolicySet(ctx, "ct:fw", FixedWindow(10, 1000), PolicyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cl.PolicySet(ctx, "ct:lb", LeakyBucket(10, 1, 1000), PolicyOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range c.Grants.Commands {
		var d Decision
		var err error
		switch cmd {
		case "RL.HIT":
			d, err = cl.Hit(ctx, "ct:fw", next(), UpTo(3))
		case "RL.ALL":
			d, err = cl.All(ctx, []Limit{{Key: next(), Policy: "ct:fw"}, {Key: next(), Spec: SlidingWindow(2, 1000)}}, UpTo(3))
		default:
			d, err = cl.Apply(ctx, next(), ctSample(strings.TrimPrefix(cmd, "RL.")), UpTo(3))
		}
		want := int64(3)
		if cmd == "RL.ALL" {
			want = 2
		}
		if err != nil || !d.Allowed || d.Granted != want {
			t.Fatalf("%s UPTO 3: %+v %v", cmd, d, err)
		}
	}
	for _, rc := range c.Grants.RefusedCommands {
		var err error
		switch {
		case rc.Policy != "":
			_, err = cl.Hit(ctx, "ct:lb", next(), UpTo(2))
		case rc.Spec > 0:
			err = raw("RL.ALL", 2, next(), next(), "FIXEDWINDOW", 10, 1000, "LEAKYBUCKET", 10, 1, 1000, "UPTO", 2)
		default:
			args := append([]any{rc.Command, next()}, ctSample(strings.TrimPrefix(rc.Command, "RL.")).args()...)
			err = raw(append(args, "UPTO", 2)...)
		}
		var se *ServerError
		if errors.As(err, &se) {
			err = errors.New(se.Message)
		}
		wantServer(rc.Command, err, rc.Message)
	}
	// The protection arguments at their bounds, and beyond (the server's
	// words).
	for _, a := range c.Protection.Arguments {
		if a.Name == "break_pct" {
			wantServer("STAGES 50 30", raw("RL.POLICY", "SET", "ct:p", "FIXEDWINDOW", 1, 1, "STAGES", 50, 30),
				"ERR break_pct must be an integer from 50 to 100")
			continue
		}
		var max int64
		if err := json.Unmarshal(a.Max, &max); err != nil {
			t.Fatal(err)
		}
		send := func(v int64) error {
			n := strconv.FormatInt(v, 10)
			switch a.Name {
			case "ERRORS":
				return raw("RL.POLICY", "SET", "ct:p", "FIXEDWINDOW", 1, 1, "ADAPT", "ERRORS", n)
			case "FACTOR", "MIN", "RECOVER", "MINCALLS":
				return raw("RL.POLICY", "SET", "ct:p", "FIXEDWINDOW", 1, 1, "ADAPT", "ERRORS", 10, a.Name, n)
			case "WINDOW":
				return raw("RL.POLICY", "SET", "ct:p", "FIXEDWINDOW", 1, 1, "WINDOW", n)
			case "degrade_pct":
				return raw("RL.POLICY", "SET", "ct:p", "FIXEDWINDOW", 1, 1, "STAGES", n, 100)
			case "pct":
				return raw("RL.POLICY", "SCALE", "ct:p", n)
			case "ok":
				return raw("RL.OUTCOME", "ct:p", n, 0)
			case "errors":
				return raw("RL.OUTCOME", "ct:p", 0, n)
			case "DENIED":
				return raw("RL.OUTCOME", "ct:p", 0, 0, "DENIED", n)
			}
			t.Fatalf("unknown argument %s", a.Name)
			return nil
		}
		for _, v := range []int64{a.Min, max} {
			if err := send(v); err != nil {
				t.Fatalf("%s %d: %v", a.Name, v, err)
			}
		}
		wantServer(a.Name, send(max+1), fmt.Sprintf("ERR %s must be an integer from %d to %d", a.Name, a.Min, max))
	}
}
