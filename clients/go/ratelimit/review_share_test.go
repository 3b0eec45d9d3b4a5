package ratelimit

import (
	"context"
	"testing"

	"github.com/redis-ratelimit/redis-ratelimit/clients/go/internal/testserver"
)

// WithShare(0.07) of 100 is 7, not 8 (100 * 0.07 is 7.000000000000001 in
// floating point): the local level admits 7 and denies the 8th without a
// call.
func TestReviewShareIsExact(t *testing.T) {
	srv := testserver.Start(t, testserver.Redis)
	ctx := context.Background()
	for _, c := range []struct {
		ratio float64
		total int64
		want  int
	}{{0.07, 100, 7}, {0.1, 30, 3}, {0.29, 100, 29}, {0.5, 3, 2}, {1, 100, 100}} {
		l := limiterOn(t, srv.Client(), WithShare(c.ratio))
		set := mustSet(t, l, NewRule("share", FixedWindow(c.total, 60000)).Global("share:"+itoa(int64(c.want))+":"+itoa(c.total)))
		admitted := 0
		for i := 0; i < c.want+1; i++ {
			if d := l.Check(ctx, set, "", 1); d.Allowed {
				admitted++
			} else if d.Path != PathLocal {
				t.Fatalf("ratio %v of %d: denied by %v: %+v", c.ratio, c.total, d.Path, d)
			}
		}
		if admitted != c.want {
			t.Fatalf("ratio %v of %d: the local level admitted %d, want %d", c.ratio, c.total, admitted, c.want)
		}
	}
}
