package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultDeadline is the deadline of one call, as in the Rust kit: what a
// healthy Redis meets on a loaded host, far above its p99.9 round trip.
// A call without a reply by then is an error wrapping ErrTimeout, and the
// Limiter's fallback decides.
const DefaultDeadline = 100 * time.Millisecond

// MinModuleVersion is the oldest module version (MODULE LIST's ver) the kit
// speaks to.
const MinModuleVersion = 100

// startDeadline bounds NewClient's checks (PING, MODULE LIST), which also
// open the first connections.
const startDeadline = 5 * time.Second

// acquireIdle is the most idle connections the blocking calls keep per
// server; more acquires at once open more (up to acquireConns), closed
// after their reply.
const acquireIdle = 8

// acquireConns is the most blocking calls at once per server (each holds a
// connection while it waits), unless the given client's PoolSize is larger.
const acquireConns = 1024

// clientConfig is what the Options set.
type clientConfig struct {
	deadline time.Duration
}

// Option configures NewClient.
type Option func(*clientConfig)

// WithDeadline sets the deadline of one call (DefaultDeadline by default);
// it must be positive.
func WithDeadline(d time.Duration) Option {
	return func(c *clientConfig) { c.deadline = d }
}

// Client is a connection to a server (standalone, Sentinel's master, or a
// cluster) with the module loaded, and the typed calls of its commands:
// one round trip each, to the node that owns the key, within the client's
// deadline, never retried. It is safe for concurrent use; WithDeadline's
// copies share its connections.
//
// Never a retry: NewClient does not send through the client it is given.
// It derives the kit's own go-redis client from that client's Options (the
// same address, Sentinel dialer, credentials, TLS, pool size), with
// MaxRetries -1 (go-redis retries a failed command 3 times by default: a
// limiter write lost after the server applied it would be applied twice)
// and ContextTimeoutEnabled (so that the call's deadline bounds the socket
// reads, not only ReadTimeout); on a cluster, node clients with MaxRetries
// -1, and every limiter command is marked NoRetry so that the cluster
// client, which follows MOVED and ASK redirects (the server applied
// nothing), never sends it again after a timeout or a lost connection.
// Blocking calls (BLOCK) go through a second derived client with its own
// pool (up to 1,024 connections per server, 8 kept idle) and no read
// timeout, so that a waiting call holds none of the connections the
// decisions use. Close closes both; the client given to
// NewClient stays the caller's (for Sentinel, it must stay open: the
// derived clients dial through its Sentinel discovery). Hooks added to the
// given client are not on the derived ones.
type Client struct {
	s        *clientShared
	deadline time.Duration
}

// clientShared is what a Client and its WithDeadline copies share.
type clientShared struct {
	given   redis.UniversalClient
	rdb     redis.UniversalClient // the kit's own: no retries, context deadlines
	acquire redis.UniversalClient // blocking calls: a pool of their own, no read timeout
	cluster *redis.ClusterClient  // rdb, when a cluster
	version int64
	once    sync.Once
	err     error
}

// NewClient checks the server and returns a Client on it. rdb is a
// *redis.Client, a Sentinel failover client (redis.NewFailoverClient) or a
// *redis.ClusterClient. NewClient sends PING and MODULE LIST (to every
// master of a cluster), within 5 s or ctx's deadline: a master without the
// module "ratelimit", or with one older than MinModuleVersion, is an error
// wrapping ErrModuleMissing that says so. A nil rdb, or another kind of
// client, is an *InvalidArgumentError with Arg "client".
func NewClient(ctx context.Context, rdb redis.UniversalClient, opts ...Option) (*Client, error) {
	cfg := clientConfig{deadline: DefaultDeadline}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.deadline <= 0 {
		return nil, &InvalidArgumentError{Rule: "NewClient", Arg: "deadline", Reason: fmt.Sprintf("must be positive, not %v", cfg.deadline)}
	}
	if isNil(rdb) {
		return nil, &InvalidArgumentError{Rule: "NewClient", Arg: "client", Reason: "the go-redis client is nil"}
	}
	s := &clientShared{given: rdb}
	switch r := rdb.(type) {
	case *redis.Client:
		main := kitOptions(r.Options())
		s.rdb = redis.NewClient(main)
		acq := kitOptions(r.Options())
		acq.ReadTimeout = -1
		acq.MinIdleConns = 0
		acq.MaxIdleConns = acquireIdle
		acq.PoolSize = max(acq.PoolSize, acquireConns)
		acq.MaxActiveConns = 0
		s.acquire = redis.NewClient(acq)
	case *redis.ClusterClient:
		main := kitClusterOptions(r.Options())
		s.cluster = redis.NewClusterClient(main)
		s.rdb = s.cluster
		acq := kitClusterOptions(r.Options())
		acq.ReadTimeout = -1
		acq.MinIdleConns = 0
		acq.MaxIdleConns = acquireIdle
		acq.PoolSize = max(acq.PoolSize, acquireConns)
		acq.MaxActiveConns = 0
		s.acquire = redis.NewClusterClient(acq)
	default:
		return nil, &InvalidArgumentError{Rule: "NewClient", Arg: "client",
			Reason: fmt.Sprintf("a *redis.Client, a failover client (redis.NewFailoverClient) or a *redis.ClusterClient, not %T", rdb)}
	}
	c := &Client{s: s, deadline: cfg.deadline}
	sctx, cancel := context.WithTimeout(ctx, startDeadline)
	defer cancel()
	// PING opens a connection (on a cluster it also loads the slots and
	// the command table the routing reads), then MODULE LIST everywhere.
	if _, err := c.exec(sctx, s.rdb, 0, 0, "PING"); err != nil {
		_ = c.Close()
		return nil, err
	}
	v, err := c.checkModule(sctx)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	s.version = v
	return c, nil
}

// isNil: a nil interface, or one holding a nil pointer.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}

// kitOptions copies a client's options with the kit's settings: no
// retries, context deadlines, no client-side cache (limiter replies are
// never cacheable).
func kitOptions(o *redis.Options) *redis.Options {
	c := *o
	c.MaxRetries = -1
	c.DialerRetries = 1
	c.ContextTimeoutEnabled = true
	if o.MaintNotificationsConfig != nil {
		m := *o.MaintNotificationsConfig
		c.MaintNotificationsConfig = &m
	}
	c.PushNotificationProcessor = nil
	c.ClientSideCacheConfig = nil
	c.ClientSideCache = nil
	c.ClientSideCacheRefreshOnInvalidate = false
	c.ClientSideCacheCoalesceMisses = false
	return &c
}

// kitClusterOptions: kitOptions for a cluster (MOVED and ASK redirects are
// still followed: a redirected command was not applied).
func kitClusterOptions(o *redis.ClusterOptions) *redis.ClusterOptions {
	c := *o
	c.Addrs = append([]string(nil), o.Addrs...)
	c.PushNotificationProcessor = nil
	c.MaxRetries = -1
	c.DialerRetries = 1
	c.ContextTimeoutEnabled = true
	if o.MaintNotificationsConfig != nil {
		m := *o.MaintNotificationsConfig
		c.MaintNotificationsConfig = &m
	}
	return &c
}

// Redis is the kit's own go-redis client (see Client): commands sent
// through it are never retried and obey their context's deadline.
func (c *Client) Redis() redis.UniversalClient { return c.s.rdb }

// Deadline is the deadline of one call.
func (c *Client) Deadline() time.Duration { return c.deadline }

// WithDeadline is a copy of the client, on the same connections, whose
// calls have deadline d (d <= 0: DefaultDeadline).
func (c *Client) WithDeadline(d time.Duration) *Client {
	if d <= 0 {
		d = DefaultDeadline
	}
	return &Client{s: c.s, deadline: d}
}

// IsCluster reports a cluster connection (then RL.ALL's keys must share a
// slot: use a hash tag).
func (c *Client) IsCluster() bool { return c.s.cluster != nil }

// ModuleVersion is the module's version that NewClient read (the lowest
// of a cluster's masters).
func (c *Client) ModuleVersion() int64 { return c.s.version }

// Close closes the kit's connections (not those of the client given to
// NewClient). Calls after Close fail with ErrConnection.
func (c *Client) Close() error {
	c.s.once.Do(func() {
		c.s.err = errors.Join(c.s.rdb.Close(), c.s.acquire.Close())
	})
	return c.s.err
}

// noRetry marks a command that go-redis must never send twice: a limiter
// write may have been applied although its reply was lost.
type noRetry struct{ *redis.Cmd }

// NoRetry tells go-redis not to retry the command.
func (noRetry) NoRetry() bool { return true }

// exec sends one command through rdb, within deadline (0: ctx's own), and
// answers its reply (nil for a null reply). keyPos is the position of the
// command's key among args (the command's name at 0; 0 for a keyless
// command): go-redis routes it to the key's master without asking the
// server where the key is. Every error is classified: a late reply wraps
// ErrTimeout, a lost or refused connection ErrConnection, an error reply is
// a *ServerError.
func (c *Client) exec(ctx context.Context, rdb redis.UniversalClient, deadline time.Duration, keyPos int, args ...any) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	if keyPos > 0 {
		cmd.SetFirstKeyPos(int8(keyPos))
	}
	cctx := ctx
	if deadline > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, deadline)
		defer cancel()
	}
	err := rdb.Process(cctx, noRetry{cmd})
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return nil, classify(ctx, cmdName(args), deadline, err)
	}
	return cmd.Val(), nil
}

func cmdName(args []any) string {
	if len(args) == 0 {
		return ""
	}
	name, _ := args[0].(string)
	if len(args) > 1 {
		if sub, ok := args[1].(string); ok && (name == "RL.POLICY" || name == "RL.LOG" || name == "MODULE" || name == "CLUSTER") {
			name += " " + sub
		}
	}
	return name
}

// unavailableCodes are error replies that say the server cannot serve now
// (loading, failing over, a slot moving): unavailability, not a bad
// request. Such an error wraps ErrConnection and is a *ServerError.
var unavailableCodes = map[string]bool{
	"LOADING": true, "MASTERDOWN": true, "READONLY": true, "TRYAGAIN": true,
	"CLUSTERDOWN": true, "MOVED": true, "ASK": true, "BUSY": true,
}

// classify maps a go-redis error onto the kit's errors. ctx is the caller's
// context: when it was cancelled, the error wraps context.Canceled.
func classify(ctx context.Context, what string, deadline time.Duration, err error) error {
	var re redis.Error
	if errors.As(err, &re) && !errors.Is(err, redis.Nil) && !isTransportText(re.Error()) {
		msg := re.Error()
		code, _, _ := strings.Cut(msg, " ")
		se := &ServerError{Message: msg}
		if unavailableCodes[code] {
			return fmt.Errorf("%w (%s): %w", ErrConnection, what, se)
		}
		return se
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("ratelimit: %s: %w", what, context.Canceled)
	}
	if isTimeout(err) {
		if deadline > 0 {
			return fmt.Errorf("%w (%s, %v): %w", ErrTimeout, what, deadline, context.DeadlineExceeded)
		}
		return fmt.Errorf("%w (%s): %w", ErrTimeout, what, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w (%s): %w", ErrConnection, what, err)
}

// isTransportText: go-redis errors that implement redis.Error but say the
// connection failed, not the server ("redis: client is closed", the pool's).
func isTransportText(msg string) bool {
	return strings.HasPrefix(msg, "redis: ")
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return strings.Contains(err.Error(), "pool timeout")
}

// eachMaster runs fn on every master (the one server of a standalone or
// Sentinel client), concurrently on a cluster, and answers each master's
// result in no particular order, or the first error.
func (c *Client) eachMaster(ctx context.Context, fn func(ctx context.Context, node *redis.Client) (any, error)) ([]any, error) {
	if c.s.cluster == nil {
		v, err := fn(ctx, c.s.rdb.(*redis.Client))
		if err != nil {
			return nil, err
		}
		return []any{v}, nil
	}
	var mu sync.Mutex
	var out []any
	err := c.s.cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		v, err := fn(ctx, node)
		if err != nil {
			return err
		}
		mu.Lock()
		out = append(out, v)
		mu.Unlock()
		return nil
	})
	if err != nil {
		var ia *InvalidArgumentError
		var se *ServerError
		if errors.As(err, &ia) || errors.As(err, &se) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrConnection) ||
			errors.Is(err, ErrProtocol) || errors.Is(err, ErrModuleMissing) || errors.Is(err, context.Canceled) {
			return nil, err
		}
		// The cluster's state could not be read (CLUSTER SLOTS).
		return nil, classify(ctx, "CLUSTER SLOTS", 0, err)
	}
	return out, nil
}

// onMasters sends one command to every master within the client's
// deadline, and answers each master's reply.
func (c *Client) onMasters(ctx context.Context, deadline time.Duration, args ...any) ([]any, error) {
	if deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, deadline)
		defer cancel()
	}
	return c.eachMaster(ctx, func(ctx context.Context, node *redis.Client) (any, error) {
		return c.exec(ctx, node, 0, 0, args...)
	})
}

// checkModule reads MODULE LIST on every master: the module's version (the
// lowest), or an error wrapping ErrModuleMissing.
func (c *Client) checkModule(ctx context.Context) (int64, error) {
	replies, err := c.eachMaster(ctx, func(ctx context.Context, node *redis.Client) (any, error) {
		v, err := c.exec(ctx, node, 0, 0, "MODULE", "LIST")
		if err != nil {
			var se *ServerError
			if errors.As(err, &se) {
				return nil, fmt.Errorf("%w: MODULE LIST refused on %s (%s): the server may not allow modules", ErrModuleMissing, node.Options().Addr, se.Message)
			}
			return nil, err
		}
		ver, found, err := moduleVersion(v)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("%w: MODULE LIST of %s has no module named ratelimit: load libredis_ratelimit.so with --loadmodule "+
				"(a managed server that cannot load modules cannot run the RL.* commands)", ErrModuleMissing, node.Options().Addr)
		}
		if ver < MinModuleVersion {
			return nil, fmt.Errorf("%w: the module ratelimit of %s is version %d, older than %d", ErrModuleMissing, node.Options().Addr, ver, MinModuleVersion)
		}
		return ver, nil
	})
	if err != nil {
		return 0, err
	}
	var lowest int64 = -1
	for _, r := range replies {
		if v := r.(int64); lowest < 0 || v < lowest {
			lowest = v
		}
	}
	return lowest, nil
}

// moduleVersion finds the module "ratelimit" in a MODULE LIST reply (RESP2
// arrays of name/value pairs, or RESP3 maps).
func moduleVersion(v any) (ver int64, found bool, err error) {
	mods, ok := v.([]any)
	if !ok {
		return 0, false, fmt.Errorf("%w: MODULE LIST answered %T", ErrProtocol, v)
	}
	for _, m := range mods {
		fields := pairs(m)
		if fields == nil {
			continue
		}
		if name, _ := fields["name"].(string); name == "ratelimit" {
			n, ok := fields["ver"].(int64)
			if !ok {
				return 0, false, fmt.Errorf("%w: MODULE LIST: the ratelimit module has no ver", ErrProtocol)
			}
			if !found || n < ver {
				ver = n
			}
			found = true
		}
	}
	return ver, found, nil
}

// pairs reads a flat list of names and values (RESP2) or a map (RESP3) as
// a map; nil for anything else.
func pairs(v any) map[string]any {
	switch t := v.(type) {
	case []any:
		out := make(map[string]any, len(t)/2)
		for i := 0; i+1 < len(t); i += 2 {
			if k, ok := t[i].(string); ok {
				out[k] = t[i+1]
			}
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, val := range t {
			if ks, ok := k.(string); ok {
				out[ks] = val
			}
		}
		return out
	case map[string]any:
		return t
	}
	return nil
}
