package ratelimit

// Conformance of the pure parts (algorithms.go, zone.go, headers.go,
// grantmath.go) against clients/contract/contract.json, property tests of
// the in-process algorithms against brute-force models, the zones' calendar
// against real servers (Redis 7.0, Valkey), a fuzz test and a benchmark.

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// pvContract is the part of contract.json these tests read.
type pvContract struct {
	Headers []struct {
		Rule            string  `json:"rule"`
		Algorithm       string  `json:"algorithm"`
		Params          []int64 `json:"params"`
		Decision        []int64 `json:"decision"`
		RateLimit       string  `json:"ratelimit"`
		RateLimitPolicy string  `json:"ratelimit_policy"`
		RetryAfter      *int64  `json:"retry_after"`
		Body            *string `json:"body"`
	} `json:"headers"`
	PolicyWindow []struct {
		Algorithm string  `json:"algorithm"`
		Params    []int64 `json:"params"`
		W         *int64  `json:"w"`
	} `json:"policy_window"`
}

var (
	pvOnce sync.Once
	pvData pvContract
	pvErr  error
)

func pvLoad(t testing.TB) *pvContract {
	t.Helper()
	pvOnce.Do(func() {
		var raw []byte
		raw, pvErr = os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
		if pvErr == nil {
			pvErr = json.Unmarshal(raw, &pvData)
		}
	})
	if pvErr != nil {
		t.Fatalf("contract.json: %v", pvErr)
	}
	return &pvData
}

// pvSpec is the Spec of a contract algorithm word and its parameters (a
// quota's period by its index, in UTC).
func pvSpec(t testing.TB, word string, params []int64) Spec {
	t.Helper()
	s := Spec{algorithm: Algorithm(word), n: len(params)}
	if len(params) > 3 {
		t.Fatalf("%s: %d params", word, len(params))
	}
	copy(s.params[:], params)
	return s
}

// pvDecision is a Decision from the contract's five integers.
func pvDecision(t testing.TB, f []int64) Decision {
	t.Helper()
	if len(f) != 5 {
		t.Fatalf("decision %v: want five integers", f)
	}
	d := Decision{Allowed: f[0] == 1, Limit: f[1], Remaining: f[2], WaitMs: f[3],
		ResetAfter: time.Duration(f[4]) * time.Millisecond, DeniedBy: -1, Granted: -1}
	if f[3] > 0 {
		d.RetryAfter = time.Duration(f[3]) * time.Millisecond
	}
	return d
}

func TestVectorsHeaders(t *testing.T) {
	c := pvLoad(t)
	if len(c.Headers) == 0 {
		t.Fatal("no header vectors")
	}
	for i, v := range c.Headers {
		spec := pvSpec(t, v.Algorithm, v.Params)
		d := pvDecision(t, v.Decision)
		f := HeaderFields(v.Rule, spec, d)
		if f.RateLimitPolicy != v.RateLimitPolicy {
			t.Errorf("#%d %s: RateLimit-Policy %q, want %q", i, v.Algorithm, f.RateLimitPolicy, v.RateLimitPolicy)
		}
		if f.RateLimit != v.RateLimit {
			t.Errorf("#%d %s: RateLimit %q, want %q", i, v.Algorithm, f.RateLimit, v.RateLimit)
		}
		want := ""
		if v.RetryAfter != nil {
			want = strconv.FormatInt(*v.RetryAfter, 10)
		}
		if f.RetryAfter != want {
			t.Errorf("#%d %s: Retry-After %q, want %q", i, v.Algorithm, f.RetryAfter, want)
		}
		body := ProblemBody(v.Rule, d)
		switch {
		case v.Body == nil && body != nil:
			t.Errorf("#%d %s: body %s, want none", i, v.Algorithm, body)
		case v.Body != nil && string(body) != *v.Body:
			t.Errorf("#%d %s: body\n%s\nwant\n%s", i, v.Algorithm, body, *v.Body)
		}
		if v.Body != nil && !json.Valid(body) {
			t.Errorf("#%d: body is not JSON: %s", i, body)
		}
	}
}

func TestVectorsHeadersPolicyWindow(t *testing.T) {
	c := pvLoad(t)
	if len(c.PolicyWindow) == 0 {
		t.Fatal("no policy_window vectors")
	}
	for i, v := range c.PolicyWindow {
		w, ok := PolicyWindowSeconds(pvSpec(t, v.Algorithm, v.Params))
		switch {
		case v.W == nil && ok:
			t.Errorf("#%d %s %v: w %d, want none", i, v.Algorithm, v.Params, w)
		case v.W != nil && (!ok || w != *v.W):
			t.Errorf("#%d %s %v: w %d (%v), want %d", i, v.Algorithm, v.Params, w, ok, *v.W)
		}
	}
}

func TestHeadersApplyAndEscapes(t *testing.T) {
	h := make(map[string][]string)
	f := HeaderFields("r", TokenBucket(5, 1, 1000), Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: time.Second})
	f.Apply(h)
	if got := h["Ratelimit-Policy"]; len(got) != 1 || got[0] != `"r";q=5;w=5` {
		t.Errorf("RateLimit-Policy %v", got)
	}
	if _, ok := h["Retry-After"]; ok {
		t.Error("Retry-After set on an admission")
	}
	body := ProblemBody("a\\b\n\x01é<", Decision{WaitMs: 1500})
	want := `{"detail":"rate limit \"a\\\\b\\n\\u0001é<\" exceeded; retry after 2 s","status":429,"title":"` +
		QuotaExceededTitle + `","type":"` + QuotaExceededType + `","violated-policies":["a\\b\n\u0001é<"]}`
	if string(body) != want {
		t.Errorf("body\n%s\nwant\n%s", body, want)
	}
	var parsed struct {
		Detail   string   `json:"detail"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(body, &parsed); err != nil || parsed.Violated[0] != "a\\b\n\x01é<" {
		t.Errorf("body does not parse back: %v %+v", err, parsed)
	}
	// A decision carrying only RetryAfter (no WaitMs) still rounds up.
	if s, ok := RetryAfterSeconds(Decision{RetryAfter: 1001 * time.Millisecond}); !ok || s != 2 {
		t.Errorf("RetryAfterSeconds from RetryAfter: %d %v", s, ok)
	}
}

// pvGolden is a golden sequence: steps on one key from idle.
type pvStep struct {
	AtUs     int64            `json:"at_us"`
	Params   []int64          `json:"params"`
	Request  map[string]int64 `json:"request"`
	Decision []int64          `json:"decision"`
	Granted  *int64           `json:"granted"`
}

type pvAlgorithms struct {
	Algorithms []struct {
		Word   string `json:"word"`
		Golden []struct {
			Steps []pvStep `json:"steps"`
		} `json:"golden"`
	} `json:"algorithms"`
	Grants struct {
		Golden []struct {
			Word   string   `json:"word"`
			Params []int64  `json:"params"`
			Steps  []pvStep `json:"steps"`
		} `json:"golden"`
	} `json:"grants"`
}

func pvLoadAlgorithms(t testing.TB) *pvAlgorithms {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
	if err != nil {
		t.Fatal(err)
	}
	var a pvAlgorithms
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	return &a
}

// pvRequest is the Request of a contract step's tagged request.
func pvRequest(t testing.TB, r map[string]int64) Request {
	t.Helper()
	if len(r) != 1 {
		t.Fatalf("request %v: want one tag", r)
	}
	for k, n := range r {
		switch k {
		case "cost":
			return Cost(uint64(n))
		case "force":
			return Force(uint64(n))
		case "refund":
			return Refund(uint64(n))
		case "upto":
			return UpTo(uint64(n))
		}
		t.Fatalf("request %v: unknown tag", r)
	}
	return Request{}
}

func pvFields(d Decision) []int64 {
	a := int64(0)
	if d.Allowed {
		a = 1
	}
	return []int64{a, d.Limit, d.Remaining, d.WaitMs, d.ResetAfter.Milliseconds()}
}

func pvEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestVectorsAlgorithmsGolden(t *testing.T) {
	c := pvLoadAlgorithms(t)
	steps := 0
	for _, alg := range c.Algorithms {
		if alg.Word == "CONCURRENCY" {
			continue
		}
		if len(alg.Golden) == 0 {
			t.Errorf("%s: no golden sequences", alg.Word)
		}
		for si, seq := range alg.Golden {
			var st LocalState
			for i, s := range seq.Steps {
				spec := pvSpec(t, alg.Word, s.Params)
				d := LocalApply(spec, &st, s.AtUs, pvRequest(t, s.Request))
				steps++
				if got := pvFields(d); !pvEqual(got, s.Decision) {
					t.Errorf("%s seq %d step %d (%v at %d, params %v): got %v, want %v",
						alg.Word, si, i, s.Request, s.AtUs, s.Params, got, s.Decision)
					break
				}
			}
		}
	}
	if steps < 1000 {
		t.Errorf("only %d golden steps checked", steps)
	}
}

func TestVectorsGrantsGolden(t *testing.T) {
	c := pvLoadAlgorithms(t)
	if len(c.Grants.Golden) == 0 {
		t.Fatal("no grants golden")
	}
	for _, seq := range c.Grants.Golden {
		var st LocalState
		spec := pvSpec(t, seq.Word, seq.Params)
		for i, s := range seq.Steps {
			req := pvRequest(t, s.Request)
			if req.IsUpTo() {
				fits := LocalFits(spec, &st, s.AtUs, req.Units())
				if s.Granted != nil && *s.Granted > 0 && int64(fits) != *s.Granted {
					t.Errorf("%s step %d: LocalFits %d, want %d", seq.Word, i, fits, *s.Granted)
				}
			}
			d := LocalApply(spec, &st, s.AtUs, req)
			if got := pvFields(d); !pvEqual(got, s.Decision) {
				t.Errorf("%s step %d (%v): got %v, want %v", seq.Word, i, s.Request, got, s.Decision)
				break
			}
			wantGranted := int64(-1)
			if s.Granted != nil && req.IsUpTo() {
				wantGranted = *s.Granted
			}
			if d.Granted != wantGranted {
				t.Errorf("%s step %d (%v): granted %d, want %d", seq.Word, i, s.Request, d.Granted, wantGranted)
			}
		}
	}
}

type pvGrants struct {
	Grants struct {
		Batched struct {
			HoldMs      struct{ Default, Min, Max int64 } `json:"hold_ms"`
			MaxSharePct struct{ Default, Min, Max int64 } `json:"max_share_pct"`
			Vectors     []struct {
				Batch       int64 `json:"batch"`
				HoldMs      int64 `json:"hold_ms"`
				Limit       int64 `json:"limit"`
				MaxSharePct int64 `json:"max_share_pct"`
				RatePerS    int64 `json:"rate_per_s"`
			} `json:"vectors"`
		} `json:"batched"`
		Stripes struct {
			ShareVectors []struct {
				N      int     `json:"n"`
				Shares []int64 `json:"shares"`
				Total  int64   `json:"total"`
			} `json:"share_vectors"`
			TagVectors []struct {
				Masters [][][2]int `json:"masters"`
				N       int        `json:"n"`
				Slots   []int      `json:"slots"`
				Tags    []string   `json:"tags"`
			} `json:"tag_vectors"`
		} `json:"stripes"`
	} `json:"grants"`
}

func pvLoadGrants(t testing.TB) *pvGrants {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g pvGrants
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	return &g
}

func TestVectorsGrantBatchSize(t *testing.T) {
	g := pvLoadGrants(t).Grants.Batched
	if len(g.Vectors) == 0 {
		t.Fatal("no batched vectors")
	}
	for i, v := range g.Vectors {
		if got := BatchSize(v.RatePerS, v.HoldMs, v.Limit, v.MaxSharePct); got != v.Batch {
			t.Errorf("#%d %+v: batch %d, want %d", i, v, got, v.Batch)
		}
	}
	// The extremes stay in range: never below 1, never above the share.
	if got := BatchSize(1<<62, 60000, 1<<40, 100); got != 1<<40 {
		t.Errorf("huge rate: %d", got)
	}
	if got := BatchSize(-5, -1, -1, -1); got != 1 {
		t.Errorf("negative inputs: %d", got)
	}
}

func TestGrantNextAskAfter(t *testing.T) {
	for _, c := range []struct {
		asked, granted, wait, hold int64
		delay                      time.Duration
		never                      bool
	}{
		{10, 10, 0, 50, 0, false},
		{10, 4, 0, 50, 50 * time.Millisecond, false},
		{10, 0, 20, 50, 50 * time.Millisecond, false},
		{10, 0, 200, 50, 200 * time.Millisecond, false},
		{1, 0, 20, 50, 20 * time.Millisecond, false},
		{10, 0, -1, 50, 0, true},
	} {
		d, never := NextAskAfter(c.asked, c.granted, c.wait, c.hold)
		if d != c.delay || never != c.never {
			t.Errorf("%+v: got %v %v", c, d, never)
		}
	}
}

func TestVectorsGrantStripeShares(t *testing.T) {
	s := pvLoadGrants(t).Grants.Stripes
	if len(s.ShareVectors) == 0 {
		t.Fatal("no share vectors")
	}
	for i, v := range s.ShareVectors {
		got := StripeShares(v.Total, v.N)
		if !pvEqual(got, v.Shares) {
			t.Errorf("#%d total %d n %d: %v, want %v", i, v.Total, v.N, got, v.Shares)
		}
		var sum int64
		for _, x := range got {
			sum += x
		}
		if sum != v.Total {
			t.Errorf("#%d: shares sum to %d, want %d", i, sum, v.Total)
		}
	}
}

func TestVectorsGrantStripeTags(t *testing.T) {
	s := pvLoadGrants(t).Grants.Stripes
	if len(s.TagVectors) == 0 {
		t.Fatal("no tag vectors")
	}
	for i, v := range s.TagVectors {
		got := PickStripeTags(v.Masters, v.N)
		if len(got) != len(v.Tags) {
			t.Fatalf("#%d: %v, want %v", i, got, v.Tags)
		}
		for j := range got {
			if got[j] != v.Tags[j] {
				t.Errorf("#%d tag %d: %q, want %q", i, j, got[j], v.Tags[j])
			}
			if slot := KeySlot(got[j]); slot != v.Slots[j] {
				t.Errorf("#%d tag %q: slot %d, want %d", i, got[j], slot, v.Slots[j])
			}
		}
	}
	if got := PickStripeTags(nil, 3); len(got) != 3 || got[2] != "rl2" {
		t.Errorf("no masters: %v", got)
	}
	if got := PickStripeTags([][][2]int{{}, {{0, 16383}}}, 2); len(got) != 2 || got[0] == got[1] {
		t.Errorf("a master without slots: %v", got)
	}
}

func TestZoneContract(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "contract", "contract.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Zones struct {
			Accepted   []string `json:"accepted"`
			Refused    []string `json:"refused"`
			ServerOnly []string `json:"refused_by_server_only"`
		} `json:"zones"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Zones.Accepted) == 0 || len(c.Zones.Refused) == 0 {
		t.Fatal("no zone vectors")
	}
	for _, z := range append(c.Zones.Accepted, c.Zones.ServerOnly...) {
		if err := ValidZone(z); err != nil {
			t.Errorf("ValidZone(%q): %v", z, err)
		}
	}
	for _, z := range append(c.Zones.Refused, "Europe//Paris", "Europe/", "1Europe", "Europe/Par is", "+18:60",
		"A/"+string(make([]byte, 64))) {
		err := ValidZone(z)
		var bad *InvalidArgumentError
		if !errors.As(err, &bad) || bad.Arg != "zone" {
			t.Errorf("ValidZone(%q) = %v, want *InvalidArgumentError{Arg: zone}", z, err)
		}
	}
}

func pvAt(t *testing.T, s string) int64 {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// The server's own calendar cases (src/calendar.rs), and midnights that a
// zone skips or repeats.
func TestZonePeriodEnd(t *testing.T) {
	for _, c := range []struct {
		p         Period
		zone, now string
		end       string
	}{
		{PeriodDay, "UTC", "2026-03-08T12:00:00Z", "2026-03-09T00:00:00Z"},
		{PeriodDay, "", "2026-03-08T12:00:00Z", "2026-03-09T00:00:00Z"},
		{PeriodDay, "+05:30", "2026-03-08T20:00:00Z", "2026-03-09T18:30:00Z"},
		{PeriodDay, "America/New_York", "2026-03-08T12:00:00Z", "2026-03-09T04:00:00Z"},
		{PeriodDay, "America/New_York", "2026-03-08T04:59:59Z", "2026-03-08T05:00:00Z"},
		{PeriodDay, "America/New_York", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{PeriodDay, "America/New_York", "2026-11-01T03:59:59Z", "2026-11-01T04:00:00Z"},
		{PeriodWeek, "UTC", "2026-12-31T10:00:00Z", "2027-01-04T00:00:00Z"},
		{PeriodWeek, "UTC", "2027-01-04T00:00:00Z", "2027-01-11T00:00:00Z"},
		{PeriodMonth, "UTC", "2028-02-29T23:59:59Z", "2028-03-01T00:00:00Z"},
		{PeriodMonth, "UTC", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z"},
		{PeriodMonth, "UTC", "2026-04-15T00:00:00Z", "2026-05-01T00:00:00Z"},
		{PeriodYear, "-08:00", "2026-12-31T23:00:00Z", "2027-01-01T08:00:00Z"},
		{PeriodMonth, "America/New_York", "2026-03-31T12:00:00Z", "2026-04-01T04:00:00Z"},
		{PeriodWeek, "Europe/Paris", "2026-03-25T12:00:00Z", "2026-03-29T22:00:00Z"},
		// Sao Paulo skipped midnight on 2018-11-04 (00:00 -03 -> 01:00 -02):
		// that day starts at 01:00 local, 03:00 UTC.
		{PeriodDay, "America/Sao_Paulo", "2018-11-03T12:00:00Z", "2018-11-04T03:00:00Z"},
		// and repeated 23:00-24:00 on 2019-02-16: the 17th starts once, at
		// 00:00 -03, 03:00 UTC.
		{PeriodDay, "America/Sao_Paulo", "2019-02-16T12:00:00Z", "2019-02-17T03:00:00Z"},
		// Havana repeated 00:00-01:00 on 2019-11-03 (01:00 -04 -> 00:00 -05):
		// the day starts at the first midnight, 04:00 UTC.
		{PeriodDay, "America/Havana", "2019-11-02T12:00:00Z", "2019-11-03T04:00:00Z"},
	} {
		got, ok := PeriodEnd(c.p, c.zone, pvAt(t, c.now))
		if want := pvAt(t, c.end); !ok || got != want {
			t.Errorf("PeriodEnd(%v, %q, %s) = %s (%v), want %s", c.p, c.zone, c.now,
				time.UnixMicro(got).UTC().Format(time.RFC3339), ok, c.end)
		}
	}
	if _, ok := PeriodEnd(PeriodDay, "Mars/Olympus_Mons", 0); ok {
		t.Error("an unknown zone reported ok")
	}
	if got, _ := PeriodEnd(PeriodYear, "Europe/Paris", 1<<62); got != 1<<62 {
		t.Errorf("the end of time: %d", got)
	}
}

// A fixed offset computed as calendar arithmetic agrees with the same
// offset read from the zone database (Etc/GMT-5 is +05:00), and UTC with
// Etc/UTC, on random instants.
func TestZonePeriodEndOffsetsAgreeWithDatabase(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for range 2000 {
		now := rng.Int64N(4_000_000_000_000_000) // to year 2096
		for p := PeriodDay; p <= PeriodYear; p++ {
			a, _ := PeriodEnd(p, "+05:00", now)
			b, okB := PeriodEnd(p, "Etc/GMT-5", now)
			c, _ := PeriodEnd(p, "-11:00", now)
			d, okD := PeriodEnd(p, "Etc/GMT+11", now)
			u, _ := PeriodEnd(p, "UTC", now)
			e, okE := PeriodEnd(p, "Etc/UTC", now)
			if !okB || !okD || !okE || a != b || c != d || u != e {
				t.Fatalf("%v at %d: +05:00 %d / %d, -11:00 %d / %d, UTC %d / %d", p, now, a, b, c, d, u, e)
			}
			if a <= now || u <= now {
				t.Fatalf("%v at %d: end %d not after now", p, now, a)
			}
		}
	}
}

// A token bucket against a brute-force model in exact integers: the bucket
// holds scaled tokens (1 token = refillMs x 1000 units), gains refillCount
// units per microsecond up to capacity tokens, and admits a cost when it
// holds it. Every decision's allowed and remaining agree; a denial's wait
// is exact to the millisecond; and the units admitted in any span never
// exceed capacity + refillCount x span / refillMs.
func TestLocalTokenBucketAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		capacity := 1 + rng.Int64N(20)
		rc := 1 + rng.Int64N(5)
		rms := 1 + rng.Int64N(2000)
		spec := TokenBucket(capacity, rc, rms)
		unit := rms * 1000
		full := capacity * unit
		scaled := full
		var st LocalState
		now := int64(1_767_225_600_000_000) + rng.Int64N(1_000_000)
		last := now
		type adm struct{ at, cost int64 }
		var admitted []adm
		for step := range 200 {
			now += rng.Int64N(3 * unit / rc)
			scaled = min(full, scaled+(now-last)*rc)
			last = now
			cost := rng.Int64N(capacity + 2)
			d := LocalApply(spec, &st, now, Cost(uint64(cost)))
			wantAllowed := cost == 0 || scaled >= cost*unit
			if wantAllowed && cost > 0 {
				scaled -= cost * unit
				admitted = append(admitted, adm{now, cost})
			}
			if d.Allowed != wantAllowed || d.Remaining != scaled/unit {
				t.Fatalf("trial %d step %d (cap %d, %d per %d ms, cost %d): got allowed %v remaining %d, model %v %d",
					trial, step, capacity, rc, rms, cost, d.Allowed, d.Remaining, wantAllowed, scaled/unit)
			}
			if d.Remaining < 0 || d.Remaining > capacity {
				t.Fatalf("remaining %d out of [0, %d]", d.Remaining, capacity)
			}
			if !d.Allowed && cost > capacity && !d.Never() {
				t.Fatalf("cost %d above capacity %d: wait %d, want never", cost, capacity, d.WaitMs)
			}
			if !d.Allowed && cost <= capacity {
				// Admitted once wait_ms has passed, not a millisecond before.
				short := cost*unit - scaled
				if want := (short + rc*1000 - 1) / (rc * 1000); d.WaitMs != want {
					t.Fatalf("wait %d ms, model %d", d.WaitMs, want)
				}
				if p := LocalPeek(spec, &st, now+d.WaitMs*1000, uint64(cost)); !p.Allowed {
					t.Fatalf("not admitted after wait %d ms", d.WaitMs)
				}
			}
		}
		for i := range admitted {
			var sum int64
			for j := i; j < len(admitted); j++ {
				sum += admitted[j].cost
				span := admitted[j].at - admitted[i].at
				if sum*unit > full+rc*span {
					t.Fatalf("trial %d: %d admitted in %d us, above %d + %d/%d ms", trial, sum, span, capacity, rc, rms)
				}
			}
		}
	}
}

// The sliding log against a brute-force log of every admission (stamped at
// its millisecond rounded up, never before the previous stamp): allowed and
// remaining agree, and the units admitted in any window_ms never exceed the
// limit.
func TestLocalSlidingAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		limit := 1 + rng.Int64N(12)
		window := 1 + rng.Int64N(300)
		spec := SlidingWindow(limit, window)
		var st LocalState
		type adm struct{ at, stamp, cost int64 }
		var log []adm
		now := int64(1_767_225_600_000_000) + rng.Int64N(1000)
		for step := range 300 {
			now += rng.Int64N(window * 1000 / 3)
			cost := rng.Int64N(limit + 2)
			var held int64
			for _, a := range log {
				if (a.stamp+window)*1000 > now {
					held += a.cost
				}
			}
			d := LocalApply(spec, &st, now, Cost(uint64(cost)))
			wantAllowed := cost == 0 || held+cost <= limit
			wantRemaining := max(limit-held, 0)
			if wantAllowed && cost > 0 {
				stamp := (now + 999) / 1000
				if len(log) > 0 {
					stamp = max(stamp, log[len(log)-1].stamp)
				}
				log = append(log, adm{now, stamp, cost})
				wantRemaining -= cost
			}
			if d.Allowed != wantAllowed || d.Remaining != wantRemaining {
				t.Fatalf("trial %d step %d (limit %d window %d, cost %d): got %v %d, model %v %d",
					trial, step, limit, window, cost, d.Allowed, d.Remaining, wantAllowed, wantRemaining)
			}
			if !d.Allowed && cost > 0 && cost <= limit {
				if p := LocalPeek(spec, &st, now+d.WaitMs*1000, uint64(cost)); !p.Allowed {
					t.Fatalf("not admitted after wait %d ms", d.WaitMs)
				}
			}
		}
		for i := range log {
			var sum int64
			for j := i; j < len(log) && log[j].at-log[i].at < window*1000; j++ {
				sum += log[j].cost
			}
			if sum > limit {
				t.Fatalf("trial %d: %d admitted within %d ms, limit %d", trial, sum, window, limit)
			}
		}
		if n := st.log.size(); int64(n) > min(2*limit, window+1) {
			t.Fatalf("the log holds %d entries, bound %d", n, min(2*limit, window+1))
		}
	}
}

// UPTO takes exactly what a scan of COST k finds to fit, on every
// algorithm, after random histories (FORCE and REFUND included).
func TestLocalFitsAgainstScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	specs := []Spec{
		TokenBucket(7, 2, 300), LeakyBucket(5, 1, 200), FixedWindow(9, 500),
		SlidingWindow(8, 400), HashWindow(10, 600, 100), QuotaSpec(6, PeriodDay, "+05:30"),
	}
	for _, spec := range specs {
		var st LocalState
		now := int64(1_767_225_600_000_000)
		for range 400 {
			now += rng.Int64N(80_000)
			var req Request
			switch r := rng.IntN(10); {
			case r < 6:
				req = Cost(uint64(rng.IntN(4)))
			case r < 7:
				req = Force(uint64(rng.IntN(5)))
			case r < 8:
				req = Refund(uint64(rng.IntN(5)))
			default:
				req = UpTo(uint64(1 + rng.IntN(12)))
			}
			most := uint64(1 + rng.IntN(12))
			var scan uint64
			for k := uint64(1); k <= most; k++ {
				if LocalPeek(spec, &st, now, k).Allowed {
					scan = k
				}
			}
			if got := LocalFits(spec, &st, now, most); got != scan {
				t.Fatalf("%s: LocalFits(%d) = %d, scan %d", spec.Algorithm(), most, got, scan)
			}
			d := LocalApply(spec, &st, now, req)
			if d.Remaining < 0 || d.Limit != spec.params[0] || d.WaitMs < -1 || d.ResetAfter < 0 {
				t.Fatalf("%s: bad decision %+v", spec.Algorithm(), d)
			}
			if req.IsUpTo() && d.Allowed != (d.Granted > 0) {
				t.Fatalf("%s: UpTo allowed %v granted %d", spec.Algorithm(), d.Allowed, d.Granted)
			}
		}
	}
}

// A denial, a peek and an invalid spec leave the state as it was; an
// invalid spec or CONCURRENCY never passes.
func TestLocalInvalidAndUnchanged(t *testing.T) {
	var st LocalState
	spec := FixedWindow(2, 1000)
	now := int64(1_767_225_600_000_000)
	LocalApply(spec, &st, now, Cost(2))
	before := st
	for _, req := range []Request{Cost(1), Cost(0), Cost(3)} {
		if d := LocalApply(spec, &st, now, req); d.Allowed != (req.Units() == 0) {
			t.Fatalf("%v: allowed %v", req, d.Allowed)
		}
	}
	if st.c != before.c || st.live != before.live || st.algo != before.algo {
		t.Fatalf("state changed by a denial or a peek: %+v -> %+v", before.c, st.c)
	}
	for _, bad := range []Spec{TokenBucket(0, 1, 1), FixedWindow(5, 0), HashWindow(5, 1000, 300),
		SlidingWindow(1<<24, 10), QuotaSpec(5, Period(9), ""), ConcurrencySpec(5, 1000), {}} {
		var s LocalState
		d := LocalApply(bad, &s, now, Cost(1))
		if d.Allowed || !d.Never() || !s.Idle() {
			t.Errorf("%v %v: %+v, idle %v", bad.Algorithm(), bad.Params(), d, s.Idle())
		}
	}
	var idle LocalState
	if d := LocalApply(spec, &idle, now, Cost(5)); d.Allowed || !d.Never() || !idle.Idle() {
		t.Errorf("a never-denial changed an idle state: %+v", d)
	}
	if d := LocalApply(spec, nil, now, Cost(1)); !d.Allowed || d.Path != PathLocal || d.Granted != -1 {
		t.Errorf("nil state: %+v", d)
	}
}

// FuzzLocalApply: any spec, any history of requests at any instants: no
// panic, and a decision in range.
func FuzzLocalApply(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(3), int64(1000), []byte{0, 1, 10, 1, 5, 200, 2, 3, 0, 3, 9, 255})
	f.Add(uint8(4), int64(10), int64(1000), int64(100), []byte{0, 1, 10, 1, 12, 200, 2, 3, 0})
	f.Add(uint8(3), int64(5), int64(7), int64(0), []byte{1, 9, 1, 2, 4, 0, 0, 0, 255})
	f.Add(uint8(5), int64(1<<40), int64(3), int64(0), []byte{1, 255, 1})
	f.Add(uint8(3), int64(5), int64(7), int64(0), []byte("0009\x04\x000\x000")) // UpTo(0)
	f.Fuzz(func(t *testing.T, algo uint8, p0, p1, p2 int64, ops []byte) {
		algos := []Algorithm{AlgorithmTokenBucket, AlgorithmLeakyBucket, AlgorithmFixedWindow,
			AlgorithmSliding, AlgorithmHashWindow, AlgorithmQuota, AlgorithmConcurrency}
		a := algos[int(algo)%len(algos)]
		zones := []string{"", "+05:30", "Europe/Paris", "-18:00"}
		spec := Spec{algorithm: a, params: [3]int64{p0, p1, p2}, n: 3, zone: zones[int(algo)/len(algos)%len(zones)]}
		if a == AlgorithmQuota {
			spec.params[1] = p1 % 5
		}
		var st LocalState
		now := int64(1_767_225_600_000_000)
		for i := 0; i+2 < len(ops) && i < 600; i += 3 {
			kind, n, dt := ops[i], uint64(ops[i+1]), int64(ops[i+2])
			if dt == 255 {
				now = now - 5_000_000 // the clock steps back
			} else {
				now += dt * dt * 97
			}
			if kind&0x80 != 0 { // a parameter change between calls
				spec.params[0] = max(1, spec.params[0]/2+int64(kind&7))
			}
			var req Request
			switch kind % 5 {
			case 0:
				req = Cost(n)
			case 1:
				req = Force(n)
			case 2:
				req = Refund(n)
			case 3:
				req = UpTo(n)
			default:
				req = Cost(n << 40)
			}
			fits := LocalFits(spec, &st, now, n)
			d := LocalApply(spec, &st, now, req)
			if d.Remaining < 0 || d.Limit < 0 || d.WaitMs < -1 || d.ResetAfter < 0 || d.RetryAfter < 0 {
				t.Fatalf("%s %v %v: decision out of range %+v", a, spec.params, req, d)
			}
			// UpTo takes what fits; when nothing does (or n is 0), it is
			// Cost(1): a denial, or for n 0 possibly one unit.
			if want := int64(fits); req.IsUpTo() && d.Granted != want && (fits > 0 || d.Granted != int64(boolU64(d.Allowed))) {
				t.Fatalf("%s: UpTo(%d) granted %d, LocalFits %d", a, n, d.Granted, fits)
			}
			if d.Allowed && !req.IsForce() && !req.IsRefund() && d.Remaining > d.Limit {
				t.Fatalf("%s: remaining %d above limit %d", a, d.Remaining, d.Limit)
			}
		}
	})
}

// BenchmarkLocalApply: one admitted-or-denied Cost(1) per op, one key, the
// clock moving 10 us a call.
func BenchmarkLocalApply(b *testing.B) {
	for _, spec := range []Spec{
		TokenBucket(100, 100, 1000), LeakyBucket(100, 100, 1000), FixedWindow(100, 1000),
		SlidingWindow(100, 1000), HashWindow(100, 1000, 100), QuotaSpec(1_000_000, PeriodDay, ""),
		QuotaSpec(1_000_000, PeriodDay, "Europe/Paris"),
	} {
		name := string(spec.Algorithm())
		if spec.Zone() != "" {
			name += "/" + spec.Zone()
		}
		b.Run(name, func(b *testing.B) {
			var st LocalState
			now := int64(1_767_225_600_000_000)
			for b.Loop() {
				now += 10
				LocalApply(spec, &st, now, Cost(1))
			}
		})
	}
	b.Run("UpTo/TOKENBUCKET", func(b *testing.B) {
		var st LocalState
		spec := TokenBucket(1000, 1000, 1000)
		now := int64(1_767_225_600_000_000)
		for b.Loop() {
			now += 1000
			LocalApply(spec, &st, now, UpTo(8))
		}
	})
}

// A quota in an IANA zone counts per local day across a DST change: calls
// every 50 minutes over ten days, limit 3 a day; each admission's day (by
// PeriodEnd, computed afresh) holds at most 3, and every day admits 3.
func TestLocalQuotaZoned(t *testing.T) {
	spec := QuotaSpec(3, PeriodDay, "Europe/Paris")
	var st LocalState
	perDay := map[int64]int{}
	start := pvAt(t, "2026-03-25T00:00:00Z")
	stop := start + 10*86_400_000_000
	for now := start; now < stop; now += 50 * 60_000_000 {
		d := LocalApply(spec, &st, now, Cost(1))
		end, ok := PeriodEnd(PeriodDay, "Europe/Paris", now)
		if !ok {
			t.Fatal("Europe/Paris unknown")
		}
		if d.Allowed {
			perDay[end]++
		} else if d.RetryAfter != time.Duration((end-now+999)/1000)*time.Millisecond {
			t.Fatalf("at %d: retry after %v, the day ends in %d us", now, d.RetryAfter, end-now)
		}
	}
	if len(perDay) < 10 {
		t.Fatalf("admissions on %d days", len(perDay))
	}
	for end, n := range perDay {
		if n != 3 && end <= stop { // the last day is cut short
			t.Errorf("the day ending %s admitted %d", time.UnixMicro(end).UTC(), n)
		}
	}
}

// PeriodEnd agrees with a real server's calendar (its jiff and tz
// database) in every zone of the database and a few spelled in another
// case: RL.QUOTA's reset_ms, read between two clock readings, brackets the
// end PeriodEnd finds, for each period. On Redis 7.0 and Valkey.
func TestZonePeriodEndAgainstServer(t *testing.T) {
	zones := []string{"UTC", "z", "+05:30", "-18:00", "+17:59", "europe/paris", "AMERICA/NEW_YORK", "asia/kolkata"}
	names := make([]string, 0, len(zoneNamesFold()))
	for _, canon := range zoneNamesFold() {
		names = append(names, canon)
	}
	slices.Sort(names)
	for i, n := range names {
		if strings.HasPrefix(n, "posix/") || strings.HasPrefix(n, "right/") {
			continue // copies of the zones (right/: with leap seconds) that jiff does not name
		}
		if i%5 == 0 || strings.HasPrefix(n, "America/") || strings.HasPrefix(n, "Australia/") {
			zones = append(zones, n)
		}
	}
	if len(zones) < 50 {
		t.Fatalf("only %d zones found in the system's database", len(zones))
	}
	for _, kind := range []testserver.Kind{testserver.Redis, testserver.Valkey} {
		t.Run(kind.String(), func(t *testing.T) {
			if !testserver.Available(kind) {
				t.Skipf("%s: no server binary", kind)
			}
			srv := testserver.Start(t, kind)
			rdb := srv.Client()
			ctx := context.Background()
			checked, skipped := 0, 0
			for _, zone := range zones {
				if err := ValidZone(zone); err != nil {
					continue // a database file whose name the grammar refuses (none in practice)
				}
				for p := PeriodDay; p <= PeriodYear; p++ {
					before := time.Now().UnixMicro()
					reply, err := rdb.Do(ctx, "RL.QUOTA", "z:"+zone+":"+p.String(), 5, p.String(), "TZ", zone).Int64Slice()
					after := time.Now().UnixMicro()
					if err != nil {
						if strings.Contains(err.Error(), "TZ must be") {
							skipped++
							continue // a file of the system's database the server's jiff does not take
						}
						t.Fatalf("RL.QUOTA TZ %s: %v", zone, err)
					}
					endBefore, ok := PeriodEnd(p, zone, before)
					endAfter, _ := PeriodEnd(p, zone, after)
					if !ok {
						t.Errorf("PeriodEnd(%v, %q): zone not found, the server knows it", p, zone)
						continue
					}
					if endBefore != endAfter {
						continue // the period ended during the call
					}
					resetUs := reply[4] * 1000
					if resetUs < endBefore-after || resetUs > endBefore-before+999 {
						t.Errorf("%v in %q: the server's reset %d ms, PeriodEnd %s (%d to %d us after the call)",
							p, zone, reply[4], time.UnixMicro(endBefore).UTC().Format(time.RFC3339), endBefore-after, endBefore-before)
					}
					checked++
				}
			}
			if checked < 200 {
				t.Errorf("only %d zone and period pairs checked", checked)
			}
			if skipped > 8 {
				t.Errorf("the server refused %d zone and period pairs of the system's database", skipped)
			}
			t.Logf("%d zones, %d zone and period pairs agree with the server (%d refused by it)", len(zones), checked, skipped)
		})
	}
}

func TestZoneKnown(t *testing.T) {
	for _, z := range []string{"Europe/Paris", "europe/paris", "AMERICA/NEW_YORK", "Etc/GMT+5"} {
		if !knownZone(z) {
			t.Errorf("knownZone(%q) = false", z)
		}
	}
	for _, z := range []string{"Mars/Olympus_Mons", "", "../UTC", "+05:30"} {
		if knownZone(z) {
			t.Errorf("knownZone(%q) = true", z)
		}
	}
}
