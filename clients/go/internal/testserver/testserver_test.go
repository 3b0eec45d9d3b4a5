package testserver

import (
	"context"
	"strings"
	"testing"
)

// answers checks that the server runs the module: RL.TOKENBUCKET admits the
// first call of a fresh key (allowed = 1, remaining = capacity - 1).
func answers(t *testing.T, do func(ctx context.Context, args ...any) (any, error), key string) {
	t.Helper()
	v, err := do(context.Background(), "RL.TOKENBUCKET", key, 10, 1, 1000)
	if err != nil {
		t.Fatalf("RL.TOKENBUCKET: %v", err)
	}
	a, ok := v.([]any)
	if !ok || len(a) < 2 || a[0] != int64(1) || a[2] != int64(9) {
		t.Fatalf("RL.TOKENBUCKET answered %#v, want [1 10 9 ...]", v)
	}
}

func TestServerKinds(t *testing.T) {
	for _, k := range Kinds {
		t.Run(k.String(), func(t *testing.T) {
			s := Start(t, k)
			answers(t, s.Do, "k")
			if got := s.Calls("rl.tokenbucket"); got != 1 {
				t.Fatalf("Calls(rl.tokenbucket) = %d, want 1", got)
			}
			if s.Info("server")["tcp_port"] != strings.TrimPrefix(s.Addr(), "127.0.0.1:") {
				t.Fatalf("INFO server tcp_port = %q, want port %d", s.Info("server")["tcp_port"], s.Port)
			}
		})
	}
}

func TestServerBareHasNoModule(t *testing.T) {
	s := StartBare(t, Redis)
	_, err := s.Do(context.Background(), "RL.TOKENBUCKET", "k", 10, 1, 1000)
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		t.Fatalf("RL.TOKENBUCKET on a bare server: %v, want unknown command", err)
	}
}

func TestServerKillRestartStop(t *testing.T) {
	s := Start(t, Redis)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	pid := s.Pid()
	s.Kill9()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after Kill9")
	}
	s.Restart()
	if s.Pid() == pid || s.Pid() == 0 {
		t.Fatalf("pid after Restart %d (was %d)", s.Pid(), pid)
	}
	WaitUntil(t, "the client to reconnect", func() bool { return c.Ping(ctx).Err() == nil })
	if n, err := c.Exists(ctx, "a").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS a after Restart = %d, %v; want 0 (nothing persisted)", n, err)
	}
	answers(t, s.Do, "k")
	s.Stop()
	s.Cont()
	answers(t, s.Do, "k2")
}

func TestServerReplicaSentinel(t *testing.T) {
	m := Start(t, Redis)
	r := StartReplica(t, m)
	if r.Info("replication")["role"] != "slave" {
		t.Fatal("the replica's role is not slave")
	}
	s := StartSentinel(t, m)
	if s.MasterAddr() != m.Addr() {
		t.Fatalf("Sentinel names master %q, want %q", s.MasterAddr(), m.Addr())
	}
	fc := s.FailoverClient()
	answers(t, func(ctx context.Context, args ...any) (any, error) { return fc.Do(ctx, args...).Result() }, "k")
}

func TestServerCluster(t *testing.T) {
	c := StartCluster(t, 3)
	cc := c.ClusterClient()
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c", "d", "e", "f"} {
		v, err := cc.Do(ctx, "RL.TOKENBUCKET", key, 10, 1, 1000).Result()
		if err != nil {
			t.Fatalf("RL.TOKENBUCKET %s on the cluster: %v", key, err)
		}
		if a, ok := v.([]any); !ok || a[0] != int64(1) {
			t.Fatalf("RL.TOKENBUCKET %s answered %#v", key, v)
		}
	}
	if got := c.Calls("rl.tokenbucket"); got != 6 {
		t.Fatalf("calls over the cluster = %d, want 6", got)
	}
	busy := 0
	for _, n := range c.Nodes {
		if n.Calls("rl.tokenbucket") > 0 {
			busy++
		}
	}
	if busy < 2 {
		t.Fatalf("keys landed on %d node(s), want them spread", busy)
	}
}

func TestServerSentinelFailover(t *testing.T) {
	m := Start(t, Redis)
	r := StartReplica(t, m)
	s := StartSentinel(t, m)
	m.Kill9()
	WaitUntil(t, "the Sentinel to promote the replica", func() bool { return s.MasterAddr() == r.Addr() })
	WaitUntil(t, "the replica's role master", func() bool {
		info, err := r.TryInfo("replication")
		return err == nil && info["role"] == "master"
	})
	fc := s.FailoverClient()
	answers(t, func(ctx context.Context, args ...any) (any, error) { return fc.Do(ctx, args...).Result() }, "after")
}

func TestServerClusterReplicas(t *testing.T) {
	c := StartClusterWith(t, ClusterOptions{Kind: Valkey, Masters: 3, Replicas: 1})
	if len(c.All()) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.All()))
	}
	for i, rs := range c.Replicas {
		if len(rs) != 1 || rs[0].Info("replication")["role"] != "slave" {
			t.Fatalf("master %d's replicas: %v", i, rs)
		}
	}
	cc := c.ClusterClient()
	if v, err := cc.Do(context.Background(), "RL.TOKENBUCKET", "k", 10, 1, 1000).Result(); err != nil {
		t.Fatalf("RL.TOKENBUCKET on the valkey cluster: %v (%v)", err, v)
	}
	if c.Calls("rl.tokenbucket") != 1 {
		t.Fatalf("calls over the masters = %d, want 1", c.Calls("rl.tokenbucket"))
	}
}
