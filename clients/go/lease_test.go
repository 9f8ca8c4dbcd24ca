package sluice

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func userCheck(domain, user string) Check {
	return Check{Domain: domain, Entries: []Entry{{"user", user}}, Hits: 1}
}

// freeSlots is the slots of `user` free now, asked with a check of 0 hits (which takes no lease).
func freeSlots(t *testing.T, c *Client, domain, user string) uint64 {
	t.Helper()
	chk := userCheck(domain, user)
	chk.Hits = 0
	r, err := c.CheckEntries(context.Background(), chk)
	if err != nil || !r.Decided() || r.Lease != 0 || len(r.Limits) != 1 {
		t.Fatalf("slots of %s/%s: %+v, %v", domain, user, r, err)
	}
	return r.Limits[0].Remaining
}

// waitForSlots polls until `user` has `want` free slots, for at most `bound`; it returns how
// long that took, or fails the test.
func waitForSlots(t *testing.T, c *Client, domain, user string, want uint64, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < bound {
		if freeSlots(t, c, domain, user) == want {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s/%s: not %d free slots within %v", domain, user, want, bound)
	return 0
}

func TestLeasesUpToMaxInFlightThenReleaseFreesOne(t *testing.T) {
	addr := startNode(t)
	for _, tr := range []Transport{UDP, TCP} {
		c := newClient(t, Options{Nodes: []string{addr}, Transport: tr, FailMode: FailClosed,
			Timeout: 500 * time.Millisecond})
		ctx := ctxTimeout(t, 5*time.Second)
		user := []string{"alice-udp", "alice-tcp"}[tr]
		chk := userCheck("c", user)
		held := []uint64{}
		for i := 0; i < inFlight; i++ {
			r, err := c.CheckEntries(ctx, chk)
			if err != nil || !r.Allowed || r.Lease == 0 {
				t.Fatalf("check %d: %+v, %v", i, r, err)
			}
			l := r.Limits[0]
			if l.Name != "in-flight" || l.Limit != inFlight || l.WindowMs != 30000 || l.Remaining != uint64(inFlight-1-i) {
				t.Fatalf("limit %d: %+v", i, l)
			}
			held = append(held, r.Lease)
		}
		if held[0] == held[1] {
			t.Fatalf("the same lease twice: %d", held[0])
		}
		if r, err := c.CheckEntries(ctx, chk); err != nil || r.Allowed || r.Lease != 0 || !r.Limits[0].Exceeded {
			t.Fatalf("over max_in_flight: %+v, %v", r, err)
		}

		if err := c.Release(ctx, chk, held[0]); err != nil {
			t.Fatalf("release: %v", err)
		}
		if n := freeSlots(t, c, "c", user); n != 1 {
			t.Fatalf("free after a release: %d", n)
		}
		err := c.Release(context.Background(), chk, held[0])
		if !errors.Is(err, ErrLeaseReleased) || errors.Is(err, ErrLeaseExpired) || errors.Is(err, ErrLeaseUnknown) {
			t.Fatalf("second release: %v", err)
		}
		if n := freeSlots(t, c, "c", user); n != 1 {
			t.Fatalf("free after a second release: %d", n)
		}
		again, err := c.CheckEntries(ctx, chk) // the freed slot
		if err != nil || !again.Allowed || again.Lease == 0 || again.Lease == held[0] || again.Lease == held[1] {
			t.Fatalf("after the release: %+v, %v", again, err)
		}

		// Another user's entries, a forged id (its expiry half kept): unknown, nothing changes.
		if err := c.Release(ctx, userCheck("c", "bob"), held[1]); !errors.Is(err, ErrLeaseUnknown) {
			t.Fatalf("other entries: %v", err)
		}
		if err := c.Release(ctx, chk, held[1]^0x5a5a5a5a); !errors.Is(err, ErrLeaseUnknown) {
			t.Fatalf("forged: %v", err)
		}
		if err := c.Release(ctx, chk, 0xff); !errors.Is(err, ErrLeaseExpired) { // expiry in 1970
			t.Fatalf("expired: %v", err)
		}
		if n := freeSlots(t, c, "c", user); n != 0 {
			t.Fatalf("free after releases that change nothing: %d", n)
		}
		chk.Hits = -1 // ignored by a release
		if err := c.Release(ctx, chk, held[1]); err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, chk, again.Lease); err != nil {
			t.Fatal(err)
		}
		if n := freeSlots(t, c, "c", user); n != inFlight {
			t.Fatalf("free at the end: %d", n)
		}
	}
}

func TestReleaseBadArguments(t *testing.T) {
	addr := startNode(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	ctx := ctxTimeout(t, 5*time.Second)
	err := c.Release(ctx, userCheck("c", "carl"), 0)
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "lease 0") {
		t.Fatalf("lease 0: %v", err)
	}
	cases := []struct {
		check Check
		want  *Error
	}{
		{userCheck("", "carl"), ErrEmptyDomain},
		{userCheck("nowhere", "carl"), ErrUnknownDomain},
		{userCheck("c", "ca\x00rl"), ErrInvalidArgument},
		{Check{Domain: "c", Entries: []Entry{{"user", "a"}, {"user", "b"}}}, ErrDuplicateEntry},
	}
	for i, tc := range cases {
		if err := c.Release(ctx, tc.check, 1); !errors.Is(err, tc.want) {
			t.Fatalf("case %d: %v, want %v", i, err, tc.want)
		}
	}
	for _, e := range []*Error{ErrLeaseUnknown, ErrLeaseExpired, ErrLeaseReleased} {
		if strings.Contains(e.Error(), "unknown status") {
			t.Fatalf("no text for status %d", e.Status)
		}
	}
	c.Close()
	if err := c.Release(ctx, userCheck("c", "carl"), 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

func TestAcquireHeldReleasesOnceAndNilHoldsNothing(t *testing.T) {
	addr := startNode(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	ctx := ctxTimeout(t, 5*time.Second)
	chk := userCheck("c", "dora")
	h1, r1, err := c.Acquire(ctx, chk)
	if err != nil || !r1.Allowed || h1 == nil || h1.Lease() != r1.Lease || r1.Lease == 0 {
		t.Fatalf("first: %v, %+v, %v", h1, r1, err)
	}
	chk.Entries[0].Value = "someone-else" // Held keeps its own copy of the entries
	chk = userCheck("c", "dora")
	h2, r2, err := c.Acquire(ctx, chk)
	if err != nil || h2 == nil || r2.Lease == r1.Lease {
		t.Fatalf("second: %v, %+v, %v", h2, r2, err)
	}
	h3, r3, err := c.Acquire(ctx, chk)
	if err != nil || r3.Allowed || h3 != nil || r3.Lease != 0 {
		t.Fatalf("denied: %v, %+v, %v", h3, r3, err)
	}
	if err := h3.Release(ctx); err != nil || h3.Lease() != 0 { // nil: nothing
		t.Fatalf("nil Held: %v", err)
	}

	// Released from several goroutines at once: one release is sent, every call returns nil.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- h1.Release(ctx) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Release: %v", err)
		}
	}
	if n := freeSlots(t, c, "c", "dora"); n != 1 {
		t.Fatalf("free after h1.Release: %d", n)
	}
	if err := c.Release(ctx, chk, h1.Lease()); !errors.Is(err, ErrLeaseReleased) {
		t.Fatalf("h1's lease released again by hand: %v", err)
	}
	// Released by hand first: the Held's own release answers "released", taken as done.
	if err := c.Release(ctx, chk, h2.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := h2.Release(ctx); err != nil {
		t.Fatalf("h2 after a release by hand: %v", err)
	}
	if n := freeSlots(t, c, "c", "dora"); n != inFlight {
		t.Fatalf("free at the end: %d", n)
	}
	if h, _, err := c.Acquire(ctx, userCheck("nowhere", "dora")); !errors.Is(err, ErrUnknownDomain) || h != nil {
		t.Fatalf("bad check: %v, %v", h, err)
	}
}

func TestAcquireDeferredReleaseRunsOnTheErrorPath(t *testing.T) {
	addr := startNode(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	errJob := errors.New("job failed")
	job := func(ctx context.Context) error {
		h, r, err := c.Acquire(ctx, userCheck("c", "emil"))
		if err != nil {
			return err
		}
		if !r.Allowed {
			return errors.New("denied")
		}
		defer h.Release(context.Background())
		if n := freeSlots(t, c, "c", "emil"); n != inFlight-1 {
			t.Errorf("free while the job runs: %d", n)
		}
		return errJob
	}
	for i := 0; i < 3*inFlight; i++ { // more jobs than slots: each gives its slot back
		if err := job(ctxTimeout(t, 5*time.Second)); !errors.Is(err, errJob) {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	if n := freeSlots(t, c, "c", "emil"); n != inFlight {
		t.Fatalf("free after the jobs: %d", n)
	}
}

func TestReleaseFailureIsReturned(t *testing.T) {
	addr, node := startNodeProcess(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 200 * time.Millisecond})
	h, r, err := c.Acquire(ctxTimeout(t, 5*time.Second), userCheck("c", "fritz"))
	if err != nil || h == nil || !r.Allowed {
		t.Fatalf("acquire: %v, %+v, %v", h, r, err)
	}
	node.Process.Kill()
	node.Wait()
	start := time.Now()
	if err := h.Release(context.Background()); !errors.Is(err, ErrUnavailable) || time.Since(start) > 2*time.Second {
		t.Fatalf("release with no node: %v after %v", err, time.Since(start))
	}
	if err := h.Release(context.Background()); err != nil { // only the first call sends
		t.Fatalf("second Release: %v", err)
	}
	// A fail-open check holds no slot: nothing to release.
	h, r, err = c.Acquire(ctxTimeout(t, 5*time.Second), userCheck("c", "fritz"))
	if err != nil || h != nil || !r.FailedOpen() || r.Lease != 0 {
		t.Fatalf("fail-open: %v, %+v, %v", h, r, err)
	}
}

func TestUnreleasedLeaseExpiresAfterLeaseTTL(t *testing.T) {
	addr := startNode(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	chk := userCheck("e", "hugo")
	start := time.Now()
	r, err := c.CheckEntries(context.Background(), chk)
	if err != nil || !r.Allowed || r.Lease == 0 || r.Limits[0].WindowMs != shortTTL.Milliseconds() {
		t.Fatalf("check: %+v, %v", r, err)
	}
	if r2, err := c.CheckEntries(context.Background(), chk); err != nil || r2.Allowed {
		t.Fatalf("second check: %+v, %v", r2, err)
	}
	waitForSlots(t, c, "e", "hugo", 1, shortTTL+3*time.Second) // held at most lease_ttl + 100 ms
	if freed := time.Since(start); freed < shortTTL-50*time.Millisecond {
		t.Fatalf("freed after %v, before its lease_ttl", freed)
	}
	if err := c.Release(context.Background(), chk, r.Lease); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("release after expiry: %v", err)
	}
}

func TestReleaseWithAnEndedContextIsStillSent(t *testing.T) {
	addr := startNode(t)
	c := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})
	h, _, err := c.Acquire(context.Background(), userCheck("c", "ines"))
	if err != nil || h == nil {
		t.Fatalf("acquire: %v, %v", h, err)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Release(ended); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("release with an ended context: %v", err)
	}
	waitForSlots(t, c, "c", "ines", inFlight, 5*time.Second)
}

// delayingRelay passes UDP checks on to `node` at once and holds each answer `delay`.
func delayingRelay(t *testing.T, node string, delay time.Duration) string {
	front, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	back, err := net.Dial("udp", node)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var client net.Addr
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := front.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			mu.Lock()
			client = from
			mu.Unlock()
			back.Write(buf[:n])
		}
	}()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, err := back.Read(buf)
			if err != nil {
				return
			}
			answer := append([]byte(nil), buf[:n]...)
			mu.Lock()
			to := client
			mu.Unlock()
			time.AfterFunc(delay, func() { front.WriteTo(answer, to) })
		}
	}()
	t.Cleanup(func() { front.Close(); back.Close() })
	return front.LocalAddr().String()
}

func TestCheckWhoseContextEndsBeforeItsAnswerReleasesTheGrantedLease(t *testing.T) {
	addr := startNode(t)
	relay := delayingRelay(t, addr, 500*time.Millisecond)
	// One attempt: a retry would be granted a second lease.
	c := newClient(t, Options{Nodes: []string{relay}, Timeout: 2 * time.Second, Attempts: 1})
	direct := newClient(t, Options{Nodes: []string{addr}, Timeout: 500 * time.Millisecond})

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.CheckEntries(ctx, userCheck("c", "jan")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("check: %v", err)
	}
	if n := freeSlots(t, direct, "c", "jan"); n != inFlight-1 { // granted; the answer is late
		t.Fatalf("free while the answer is in the relay: %d", n)
	}
	waitForSlots(t, direct, "c", "jan", inFlight, 5*time.Second) // not its 30 s lease_ttl

	// The same for a batch.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	rs, err := c.CheckBatch(ctx2, []Check{userCheck("c", "kai"), userCheck("c", "kai"), userCheck("t", "kai")})
	if !errors.Is(err, context.DeadlineExceeded) || len(rs) != 3 {
		t.Fatalf("batch: %v, %v", rs, err)
	}
	if n := freeSlots(t, direct, "c", "kai"); n != 0 {
		t.Fatalf("free while the batch's answer is in the relay: %d", n)
	}
	waitForSlots(t, direct, "c", "kai", inFlight, 5*time.Second)
}
