package ratelimit

import (
	"hash/maphash"
	"sync"
	"time"
)

// denyShards is the number of independently locked parts of the deny cache.
const denyShards = 16

type denyEntry struct {
	d     Decision
	at    time.Time
	until time.Time
}

type denyShard struct {
	mu sync.Mutex
	m  map[mapKey]denyEntry
}

// denyCache is the local deny cache: after a denial with wait_ms w, the same
// rule and key deny in process for min(w, max), the reply's fields counting
// down, without a round trip. Bounded by a size cap (per shard: cap /
// denyShards, at least 1).
type denyCache struct {
	max    time.Duration
	capPer int
	seed   maphash.Seed
	shards [denyShards]denyShard
}

func newDenyCache(max time.Duration, capacity int) *denyCache {
	c := &denyCache{max: max, capPer: max1(capacity / denyShards), seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[mapKey]denyEntry)
	}
	return c
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

func (c *denyCache) shard(key mapKey) *denyShard {
	h := maphash.String(c.seed, key.rule) ^ maphash.String(c.seed, key.id)*0x9e3779b97f4a7c15
	return &c.shards[h%denyShards]
}

// get is the cached denial of key, its times counted down to now.
func (c *denyCache) get(key mapKey, now time.Time) (Decision, bool) {
	s := c.shard(key)
	s.mu.Lock()
	e, ok := s.m[key]
	if ok && !now.Before(e.until) {
		delete(s.m, key)
		ok = false
	}
	s.mu.Unlock()
	if !ok {
		return Decision{}, false
	}
	elapsed := now.Sub(e.at)
	d := e.d
	// Never below 1 ms while the entry denies: a denial always says to wait.
	d.WaitMs = max(d.WaitMs-elapsed.Milliseconds(), 1)
	d.RetryAfter = time.Duration(d.WaitMs) * time.Millisecond
	d.ResetAfter = max(d.ResetAfter-elapsed, 0)
	d.Path = PathDenyCache
	return d, true
}

// put remembers a denial of key for min(wait, max); a denial that can never
// pass, or has no wait, is not cached.
func (c *denyCache) put(key mapKey, d Decision, now time.Time) {
	if d.Allowed || d.WaitMs <= 0 {
		return
	}
	ttl := min(time.Duration(d.WaitMs)*time.Millisecond, c.max)
	if ttl <= 0 {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, there := s.m[key]; !there && len(s.m) >= c.capPer {
		for k, e := range s.m {
			if !now.Before(e.until) {
				delete(s.m, k)
			}
		}
		if len(s.m) >= c.capPer {
			var soonest mapKey
			var at time.Time
			first := true
			for k, e := range s.m {
				if first || e.until.Before(at) {
					soonest, at, first = k, e.until, false
				}
			}
			delete(s.m, soonest)
		}
	}
	s.m[key] = denyEntry{d: d, at: now, until: now.Add(ttl)}
}

// len is the number of entries held (for tests of the bound).
func (c *denyCache) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].m)
		c.shards[i].mu.Unlock()
	}
	return n
}
