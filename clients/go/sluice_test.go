package sluice

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The rules of every test node (../testdata/rules.yaml, shared with the Python tests): 3 per
// minute per user (1-second buckets keep the count exact).
// Concurrency limits: in domain "c" at most inFlight leases held per user, each held 30 s unless
// released; in domain "e" one, held shortTTL (the shortest lease_ttl there is).
const limit = 3
const inFlight = 2
const shortTTL = time.Second

// freePort is a port free for TCP and UDP on 127.0.0.1 right now.
func freePort(t *testing.T) int {
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			continue
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// startNode runs sluiced (SLUICED_BIN) on a free loopback port until the test ends.
func startNode(t *testing.T) string {
	addr, _ := startNodeProcess(t)
	return addr
}

// startNodeProcess is startNode, with the process (for a test that kills it early).
func startNodeProcess(t *testing.T) (string, *exec.Cmd) {
	bin := os.Getenv("SLUICED_BIN")
	if bin == "" {
		t.Fatal("SLUICED_BIN must name the sluiced binary")
	}
	dir := t.TempDir()
	rulesFile, err := filepath.Abs(filepath.Join("..", "testdata", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	log, err := os.Create(filepath.Join(dir, "sluiced.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--udp", addr, "--tcp", addr, "--admin", "", "--grpc", "",
		"--data-dir", "", "--rules", rulesFile, "--threads", "1", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
	probe, err := New(Options{Nodes: []string{addr}, Timeout: 100 * time.Millisecond, FailMode: FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	for i := 0; i < 100; i++ { // 100 x (<= 100 ms + 50 ms)
		r, _ := probe.CheckEntries(context.Background(), Check{Domain: "t", Entries: []Entry{{"user", "probe"}}})
		if r.Decided() {
			return addr, cmd
		}
		time.Sleep(50 * time.Millisecond)
	}
	text, _ := os.ReadFile(filepath.Join(dir, "sluiced.log"))
	t.Fatalf("sluiced did not answer within 10 s:\n%s", text)
	return "", nil
}

func newClient(t *testing.T, o Options) *Client {
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCheckAllowsUpToTheLimitThenDenies(t *testing.T) {
	addr := startNode(t)
	for _, tr := range []Transport{UDP, TCP} {
		c := newClient(t, Options{Nodes: []string{addr}, Transport: tr, Timeout: 500 * time.Millisecond})
		user := fmt.Sprintf("alice-%d", tr)
		for i := 0; i < limit+2; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			r, err := c.Check(ctx, "t", map[string]string{"user": user})
			cancel()
			if err != nil || !r.Decided() || len(r.Limits) != 1 {
				t.Fatalf("check %d: %+v, %v", i, r, err)
			}
			l := r.Limits[0]
			if l.Name != "per-user" || l.Limit != limit || l.WindowMs != 60000 || l.Mode != "enforce" {
				t.Fatalf("limit: %+v", l)
			}
			if i < limit && (!r.Allowed || l.Remaining != uint64(limit-1-i) || l.Exceeded) {
				t.Fatalf("check %d should be allowed: %+v", i, r)
			}
			if i >= limit && (r.Allowed || !l.Exceeded || r.RetryAfterMs() <= 0) {
				t.Fatalf("check %d should be denied: %+v", i, r)
			}
		}
		// The blocking path (no deadline on the context) gives the same answers.
		r, err := c.CheckEntries(context.Background(), Check{Domain: "t", Entries: []Entry{{"user", user + "-bg"}}, Hits: 2})
		if err != nil || !r.Allowed || r.Limits[0].Remaining != limit-2 {
			t.Fatalf("background check: %+v, %v", r, err)
		}
	}
}

func TestCheckBatchOneResultPerCheck(t *testing.T) {
	addr := startNode(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	checks := []Check{}
	for i := 0; i < 5; i++ {
		checks = append(checks, Check{Domain: "t", Entries: []Entry{{"user", "carol"}}, Hits: 1})
	}
	checks = append(checks, Check{Domain: "", Entries: []Entry{{"user", "carol"}}, Hits: 1},
		Check{Domain: "nowhere", Entries: []Entry{{"user", "carol"}}, Hits: 1},
		Check{Domain: "t", Entries: []Entry{{"user", "da\x00ve"}}, Hits: 1})
	for _, ctx := range []context.Context{context.Background(), ctxTimeout(t, 2*time.Second)} {
		if ctx != context.Background() {
			for i := range checks[:5] {
				checks[i].Entries = []Entry{{"user", "carol-ctx"}}
			}
		}
		rs, err := c.CheckBatch(ctx, checks)
		if err != nil || len(rs) != len(checks) {
			t.Fatalf("batch: %v, %d results", err, len(rs))
		}
		allowed := 0
		for _, r := range rs[:5] {
			if r.Status != 0 {
				t.Fatalf("status %d", r.Status)
			}
			if r.Allowed {
				allowed++
			}
		}
		if allowed != limit {
			t.Fatalf("allowed %d of 5, want %d", allowed, limit)
		}
		if rs[5].Status != ErrEmptyDomain.Status || rs[5].Allowed || rs[5].Outcome != Invalid {
			t.Fatalf("empty domain: %+v", rs[5])
		}
		if rs[6].Status != ErrUnknownDomain.Status || !rs[6].Decided() {
			t.Fatalf("unknown domain: %+v", rs[6])
		}
		if rs[7].Status != ErrInvalidArgument.Status || rs[7].Allowed {
			t.Fatalf("NUL in a value: %+v", rs[7])
		}
	}
	if rs, err := c.CheckBatch(context.Background(), nil); err != nil || len(rs) != 0 {
		t.Fatalf("empty batch: %v, %v", rs, err)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestConcurrentChecksShareTheLimit(t *testing.T) {
	addr := startNode(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Check(ctxTimeout(t, 2*time.Second), "t", map[string]string{"user": "erin"})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			if r.Allowed {
				allowed++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if allowed != limit {
		t.Fatalf("allowed %d of 20, want %d", allowed, limit)
	}
}

func TestFailoverToTheSecondNode(t *testing.T) {
	addr := startNode(t)
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	for _, tr := range []Transport{UDP, TCP} {
		c := newClient(t, Options{Nodes: []string{dead, addr}, Transport: tr, FailMode: FailClosed,
			Timeout: 500 * time.Millisecond})
		r, err := c.Check(ctxTimeout(t, 2*time.Second), "t", map[string]string{"user": fmt.Sprintf("gina-%d", tr)})
		if err != nil || !r.Decided() || !r.Allowed || r.Limits[0].Remaining != limit-1 {
			t.Fatalf("failover (%d): %+v, %v", tr, r, err)
		}
	}
}

func TestFailModeDecidesWhenNoNodeAnswers(t *testing.T) {
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	for _, mode := range []FailMode{FailOpen, FailClosed} {
		c := newClient(t, Options{Nodes: []string{dead}, FailMode: mode, Timeout: 100 * time.Millisecond})
		start := time.Now()
		r, err := c.Check(ctxTimeout(t, 2*time.Second), "t", map[string]string{"user": "hank"})
		if err != nil || time.Since(start) > time.Second {
			t.Fatalf("fail mode %d: %v after %v", mode, err, time.Since(start))
		}
		if r.Outcome != Unavailable || r.Allowed != (mode == FailOpen) || r.FailedOpen() != (mode == FailOpen) {
			t.Fatalf("fail mode %d: %+v", mode, r)
		}
	}
}

func TestContextDeadlineIsHonoured(t *testing.T) {
	// A node that takes datagrams and never answers; the client's own timeout is 1 s.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	c := newClient(t, Options{Nodes: []string{silent.LocalAddr().String()}, FailMode: FailClosed,
		Timeout: time.Second, Attempts: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	r, err := c.Check(ctx, "t", map[string]string{"user": "ivan"})
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || r.Allowed || took > time.Second {
		t.Fatalf("deadline: %+v, %v after %v", r, err, took)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	rs, err := c.CheckBatch(ctx2, []Check{{Domain: "t", Entries: []Entry{{"user", "ivan"}}, Hits: 1}})
	if !errors.Is(err, context.DeadlineExceeded) || len(rs) != 1 || rs[0].Allowed || time.Since(start) > 2*time.Second {
		t.Fatalf("batch deadline: %+v, %v", rs, err)
	}
	done, cancel3 := context.WithCancel(context.Background())
	cancel3()
	if _, err := c.Check(done, "t", map[string]string{"user": "ivan"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

func TestBadInputIsAnError(t *testing.T) {
	addr := startNode(t)
	if _, err := New(Options{Nodes: []string{"nonsense"}}); !errors.Is(err, ErrBadNode) {
		t.Fatalf("bad node: %v", err)
	}
	if _, err := New(Options{Nodes: []string{"::1:7350"}}); !errors.Is(err, ErrBadNode) || !strings.Contains(err.Error(), "brackets") {
		t.Fatalf("v6 without brackets: %v", err)
	}
	if _, err := New(Options{}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "no nodes") {
		t.Fatalf("no nodes: %v", err)
	}
	if _, err := New(Options{Nodes: []string{addr}, Transport: 9}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("transport: %v", err)
	}
	if _, err := New(Options{Nodes: []string{addr}, Timeout: -time.Second}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative timeout: %v", err)
	}
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	ctx := ctxTimeout(t, 5*time.Second)
	long := strings.Repeat("x", 300)
	huge := strings.Repeat("x", 5000)
	many := make([]Entry, 65)
	for i := range many {
		many[i] = Entry{fmt.Sprintf("k%d", i), "v"}
	}
	cases := []struct {
		check Check
		want  *Error
	}{
		{Check{Domain: "", Entries: []Entry{{"user", "judy"}}, Hits: 1}, ErrEmptyDomain},
		{Check{Domain: "nowhere", Entries: []Entry{{"user", "judy"}}, Hits: 1}, ErrUnknownDomain},
		{Check{Domain: "t", Entries: []Entry{{"user", huge}}, Hits: 1}, ErrTooLarge},
		{Check{Domain: "t", Entries: []Entry{{huge, "judy"}}, Hits: 1}, ErrTooLarge},
		{Check{Domain: "t", Entries: []Entry{{"user", long}}, Hits: 1}, ErrEntryTooLong},
		{Check{Domain: "t", Entries: []Entry{{"user", "judy"}}, Hits: -1}, ErrNegativeHits},
		{Check{Domain: "t", Entries: many, Hits: 1}, ErrTooManyEntries},
		{Check{Domain: "t", Entries: []Entry{{"", "judy"}}, Hits: 1}, ErrEmptyEntryKey},
		{Check{Domain: "t", Entries: []Entry{{"user", "a"}, {"user", "b"}}, Hits: 1}, ErrDuplicateEntry},
		{Check{Domain: "t\x00", Entries: []Entry{{"user", "judy"}}, Hits: 1}, ErrInvalidArgument},
	}
	for _, bg := range []context.Context{context.Background(), ctx} {
		for i, tc := range cases {
			r, err := c.CheckEntries(bg, tc.check)
			if !errors.Is(err, tc.want) || r.Allowed {
				t.Fatalf("case %d: %+v, %v; want %v", i, r, err, tc.want)
			}
		}
	}
	if r, err := c.Check(ctx, "t", map[string]string{"user": "judy"}); err != nil || !r.Allowed {
		t.Fatalf("still usable: %+v, %v", r, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(ctx, "t", map[string]string{"user": "judy"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if _, err := c.CheckBatch(ctx, []Check{{Domain: "t", Hits: 1}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("batch after close: %v", err)
	}
}

func TestMiddlewareAnswers429WithRetryAfter(t *testing.T) {
	addr := startNode(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("hello\n")) })
	srv := httptest.NewServer(Middleware(c, "t", func(r *http.Request) map[string]string {
		return map[string]string{"user": r.Header.Get("X-User")}
	})(hello))
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second}
	codes := []int{}
	var last *http.Response
	for i := 0; i < limit+1; i++ {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-User", "lee")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if i == 0 && resp.Header.Get("RateLimit-Remaining") != fmt.Sprint(limit-1) {
			t.Fatalf("RateLimit-Remaining: %q", resp.Header.Get("RateLimit-Remaining"))
		}
		last = resp
	}
	if fmt.Sprint(codes) != "[200 200 200 429]" || last.Header.Get("Retry-After") == "" {
		t.Fatalf("codes %v, Retry-After %q", codes, last.Header.Get("Retry-After"))
	}
}
