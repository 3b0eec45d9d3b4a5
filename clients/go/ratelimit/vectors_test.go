package ratelimit

// Conformance of the pure parts (algorithms.go, zone.go, headers.go,
// grantmath.go) against clients/contract/contract.json, property tests of
// the in-process algorithms against brute-force models, a fuzz test and a
// benchmark.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
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
