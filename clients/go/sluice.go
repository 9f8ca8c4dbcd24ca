// Package sluice is Sluice's Go client: cgo over libsluice.so, the C API of the C++ client
// (lib/client/include/sluice/sluice.h). Batching, failover, timeouts and the fail mode are
// libsluice's; this package converts arguments and results, and honours contexts.
//
//	c, err := sluice.New(sluice.Options{Nodes: []string{"127.0.0.1:7350"}})
//	r, err := c.Check(ctx, "api", map[string]string{"user": "42"})
//	if err == nil && !r.Allowed { /* 429 */ }
//
// A concurrency limit's lease is given back with Release, or by the *Held that Acquire returns:
//
//	h, r, err := c.Acquire(ctx, sluice.Check{Domain: "jobs", Entries: entries, Hits: 1})
//	if err == nil && !r.Allowed { /* 429 */ }
//	defer h.Release(context.Background()) // nil when nothing was granted: does nothing
//
// Build: the header and the library must be where cgo finds them (cmake --install puts them in
// the system paths), or name them: CGO_CFLAGS=-I<repo>/lib/client/include
// CGO_LDFLAGS="-L<build>/lib/client -Wl,-rpath,<build>/lib/client".
//
// A Client is safe for concurrent use; Close it when done.
package sluice

/*
#cgo LDFLAGS: -lsluice
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sluice/sluice.h>

extern void sluiceGoDone(sluice_result* result, uintptr_t handle);

static void sluice_go_done(const sluice_result* result, void* user) {
  sluiceGoDone((sluice_result*)result, (uintptr_t)user);
}

static int sluice_go_check_async(sluice_client* c, const sluice_check* check, uintptr_t handle) {
  return sluice_check_async(c, check, sluice_go_done, (void*)handle);
}

static void sluice_go_result_init(sluice_result* r, size_t n) {
  for (size_t i = 0; i < n; ++i) sluice_result_init(&r[i]);
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime/cgo"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Transport of checks.
type Transport int

const (
	UDP Transport = C.SLUICE_UDP
	TCP Transport = C.SLUICE_TCP
)

// FailMode decides `Allowed` when no node does.
type FailMode int

const (
	FailOpen   FailMode = C.SLUICE_FAIL_OPEN
	FailClosed FailMode = C.SLUICE_FAIL_CLOSED
)

// Outcome says how a result came about.
type Outcome int

const (
	Decided     Outcome = C.SLUICE_DECIDED
	Refused     Outcome = C.SLUICE_REFUSED
	Invalid     Outcome = C.SLUICE_INVALID
	Unavailable Outcome = C.SLUICE_UNAVAILABLE
)

// Options mirror sluice_options; zero values take libsluice's defaults.
type Options struct {
	Nodes                 []string // "host:port" in order of preference
	Transport             Transport
	FailMode              FailMode
	Timeout               time.Duration // a check's whole budget, retries included (20 ms)
	Attempts              int           // sends per check at most (2)
	BatchWindow           time.Duration // how long a first check waits for company (0)
	MaxChecksPerRequest   int           // 1..1024 (64)
	UDPAnswerRoomPerCheck int           // UDP padding per check (288)
	ConnectTimeout        time.Duration // TCP (1 s)
}

// Limit is one limit that applied to a check.
type Limit struct {
	Name         string
	Limit        uint64
	WindowMs     int64
	Remaining    uint64
	ResetMs      int64
	RetryAfterMs int64 // -1: the cost never fits
	Mode         string
	Exceeded     bool
}

// Result of one check. Allowed is always set.
type Result struct {
	Status      Status
	Outcome     Outcome
	Allowed     bool
	WouldDeny   bool
	Shadow      bool
	Allowlisted bool
	Truncated   bool
	Limits      []Limit
	// Lease is granted by the check's concurrency limits when they admitted it; 0 = none
	// (denied, no concurrency limit, or no node decided). Give it back with Release (the same
	// domain and entries), or it is held until its lease_ttl is over.
	Lease uint64
}

// Decided reports whether a node decided.
func (r Result) Decided() bool { return r.Outcome == Decided }

// FailedOpen reports a request let through by the fail mode: count these, alert on them.
func (r Result) FailedOpen() bool { return !r.Decided() && r.Allowed }

// RetryAfterMs is the longest wait of the exceeded limits (0: none, -1: never fits).
func (r Result) RetryAfterMs() int64 {
	var wait int64
	for _, l := range r.Limits {
		if !l.Exceeded {
			continue
		}
		if l.RetryAfterMs < 0 {
			return -1
		}
		if l.RetryAfterMs > wait {
			wait = l.RetryAfterMs
		}
	}
	return wait
}

// Entry is one descriptor entry, for keys that need an order or repeat.
type Entry struct{ Key, Value string }

// Check is one check of a batch.
type Check struct {
	Domain  string
	Entries []Entry
	Hits    int64 // 0 asks without counting; use 1 for one request
}

// clone is chk with Entries of its own: for a release after the call that got chk returned.
func (chk Check) clone() Check {
	chk.Entries = append([]Entry(nil), chk.Entries...)
	return chk
}

// Client is a libsluice client. Safe for concurrent use.
type Client struct {
	mu       sync.RWMutex // guards c: read-held around every C call, write-held by Close
	c        *C.sluice_client
	failMode FailMode
}

// New resolves the nodes and starts libsluice's I/O thread.
func New(o Options) (*Client, error) {
	var opts C.sluice_options
	C.sluice_options_init(&opts)
	nodes := C.malloc(C.size_t(len(o.Nodes)+1) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(nodes)
	array := unsafe.Slice((**C.char)(nodes), len(o.Nodes)+1)
	for i, n := range o.Nodes {
		array[i] = C.CString(n)
		defer C.free(unsafe.Pointer(array[i]))
	}
	opts.nodes = (**C.char)(nodes)
	opts.num_nodes = C.size_t(len(o.Nodes))
	opts.transport = C.int(o.Transport)
	opts.fail_mode = C.int(o.FailMode)
	var err error
	set := func(v int64, dst *C.uint32_t, what string) {
		if v == 0 || err != nil {
			return
		}
		if v < 0 || v > 1<<32-1 {
			err = &Error{Status: ErrInvalidArgument.Status, Message: what + " out of range"}
			return
		}
		*dst = C.uint32_t(v)
	}
	set(o.Timeout.Microseconds(), &opts.timeout_us, "Timeout")
	set(int64(o.Attempts), &opts.attempts, "Attempts")
	set(o.BatchWindow.Microseconds(), &opts.batch_window_us, "BatchWindow")
	set(int64(o.MaxChecksPerRequest), &opts.max_checks_per_request, "MaxChecksPerRequest")
	set(int64(o.UDPAnswerRoomPerCheck), &opts.udp_answer_room_per_check, "UDPAnswerRoomPerCheck")
	set(o.ConnectTimeout.Milliseconds(), &opts.connect_timeout_ms, "ConnectTimeout")
	if err != nil {
		return nil, err
	}
	var why [512]C.char
	var c *C.sluice_client
	if st := C.sluice_client_create(&opts, &c, &why[0], C.size_t(len(why))); st != C.SLUICE_OK {
		return nil, &Error{Status: Status(st), Message: C.GoString(&why[0])}
	}
	return &Client{c: c, failMode: o.FailMode}, nil
}

// Close completes pending checks (as unavailable), stops libsluice's thread and frees the
// client. Calls after Close return ErrClosed. Idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		return nil
	}
	if st := C.sluice_client_destroy(&c.c); st != C.SLUICE_OK {
		return statusError(st)
	}
	return nil
}

// Check asks whether one request (cost 1) described by `descriptors` may go ahead. Entries are
// sent sorted by key. See CheckEntries.
func (c *Client) Check(ctx context.Context, domain string, descriptors map[string]string) (Result, error) {
	entries := make([]Entry, 0, len(descriptors))
	for k, v := range descriptors {
		entries = append(entries, Entry{k, v})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Key < entries[j].Key })
	return c.CheckEntries(ctx, Check{Domain: domain, Entries: entries, Hits: 1})
}

// CheckEntries runs one check. It returns within the client's timeout, or when ctx ends first
// (then the error is ctx.Err() and the result is the fail mode's, outcome Unavailable; a lease
// the check is granted after all is released in the background, since nobody else knows of
// it). A result decided by a node or by the fail mode (Unavailable, Refused, NoRoom) comes with a
// nil error; a bad check returns its *Error (errors.Is(err, sluice.ErrEmptyDomain), ...).
func (c *Client) CheckEntries(ctx context.Context, chk Check) (Result, error) {
	if err := ctx.Err(); err != nil {
		return c.ctxResult(), err
	}
	mem, err := marshal([]Check{chk})
	if err != nil {
		return Result{Status: err.Status, Outcome: Invalid}, err
	}
	if ctx.Done() == nil { // no deadline, no cancellation: the blocking call
		defer C.free(mem.block)
		var r C.sluice_result
		C.sluice_result_init(&r)
		c.mu.RLock()
		st := C.sluice_check_one(c.c, mem.checks, &r)
		c.mu.RUnlock()
		return answer(st, &r)
	}
	done := make(chan Result, 1)
	h := cgo.NewHandle(done)
	c.mu.RLock()
	st := C.sluice_go_check_async(c.c, mem.checks, C.uintptr_t(h))
	c.mu.RUnlock()
	C.free(mem.block) // copied by libsluice before sluice_check_async returned
	if st != C.SLUICE_OK {
		h.Delete()
		return Result{Status: Status(st), Outcome: Invalid}, statusError(st)
	}
	select {
	case r := <-done:
		if !answers(r.Status) {
			return r, statusError(C.int(r.Status))
		}
		return r, nil
	case <-ctx.Done():
		// The callback still runs later (within the timeout, or at Close), into the buffered
		// channel. A lease it brings is known to nobody else: give it back.
		chk = chk.clone()
		go func() {
			if r := <-done; r.Lease != 0 {
				c.Release(context.Background(), chk, r.Lease)
			}
		}()
		return c.ctxResult(), ctx.Err()
	}
}

// CheckBatch runs several checks sharing requests; one Result per check, each with its own
// Status (a bad check does not fail the others). The error is the call's (a closed client, a
// context that ended: then every result is the fail mode's, and leases the checks are granted
// after all are released in the background).
func (c *Client) CheckBatch(ctx context.Context, checks []Check) ([]Result, error) {
	if len(checks) == 0 {
		return nil, nil
	}
	if len(checks) > C.SLUICE_MAX_BATCH {
		return nil, &Error{Status: ErrInvalidArgument.Status, Message: "too many checks"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Checks that fail in Go (a NUL in a string) get their result here and are not sent.
	out := make([]Result, len(checks))
	send := make([]Check, 0, len(checks))
	index := make([]int, 0, len(checks))
	for i, chk := range checks {
		if err := validate(chk); err != nil {
			out[i] = Result{Status: err.Status, Outcome: Invalid}
			continue
		}
		send = append(send, chk)
		index = append(index, i)
	}
	if len(send) == 0 {
		return out, nil
	}
	mem, err := marshal(send)
	if err != nil {
		return nil, err
	}
	results := (*C.sluice_result)(C.malloc(C.size_t(len(send)) * C.size_t(C.sizeof_sluice_result)))
	C.sluice_go_result_init(results, C.size_t(len(send)))
	finished := make(chan C.int, 1)
	run := func() {
		c.mu.RLock()
		st := C.sluice_check_batch(c.c, mem.checks, C.size_t(len(send)), results)
		c.mu.RUnlock()
		finished <- st
	}
	free := func() {
		C.free(mem.block)
		C.free(unsafe.Pointer(results))
	}
	start(ctx, run)
	select {
	case st := <-finished:
		defer free()
		if st != C.SLUICE_OK {
			return nil, statusError(st)
		}
		rs := unsafe.Slice(results, len(send))
		for k := range rs {
			out[index[k]] = convert(&rs[k])
		}
		return out, nil
	case <-ctx.Done():
		for k := range send {
			send[k] = send[k].clone()
		}
		go func() { // the C call ends within the timeout; the leases it was granted go back
			type grant struct {
				chk   Check
				lease uint64
			}
			var grants []grant
			if st := <-finished; st == C.SLUICE_OK {
				rs := unsafe.Slice(results, len(send))
				for k := range rs {
					if rs[k].lease != 0 {
						grants = append(grants, grant{send[k], uint64(rs[k].lease)})
					}
				}
			}
			free()
			for _, g := range grants {
				c.Release(context.Background(), g.chk, g.lease)
			}
		}()
		for i := range out {
			out[i] = c.ctxResult()
		}
		return out, ctx.Err()
	}
}

// Release gives back a lease (a Result's Lease), blocking for up to the client's timeout. chk
// must name the domain and entries of the check that was granted it (its Hits is ignored).
//
// It returns nil when the lease's slots were freed; ErrLeaseReleased, ErrLeaseExpired or
// ErrLeaseUnknown when a node answered and nothing changed (a release is idempotent);
// ErrUnavailable or ErrRefused when no node decided (the lease is held until its lease_ttl is
// over: try again, or let it expire); ErrInvalidArgument for lease 0 (ErrClosed after Close); a
// check's errors as CheckEntries (ErrUnknownDomain, ...).
//
// A release is sent even when ctx has ended, before or during the call: ctx only bounds the
// wait (then the error is ctx.Err() and the release goes on in the background, its outcome
// lost). A release is clean-up: a request whose context was cancelled must still give back its
// slot.
func (c *Client) Release(ctx context.Context, chk Check, lease uint64) error {
	if lease == 0 {
		return &Error{Status: ErrInvalidArgument.Status,
			Message: "lease 0: nothing was granted, nothing to release"}
	}
	chk.Hits = 0 // ignored by sluice_release
	mem, err := marshal([]Check{chk})
	if err != nil {
		return err
	}
	finished := make(chan C.int, 1)
	run := func() {
		c.mu.RLock()
		st := C.sluice_release(c.c, mem.checks, C.uint64_t(lease))
		c.mu.RUnlock()
		C.free(mem.block)
		finished <- st
	}
	start(ctx, run)
	select {
	case st := <-finished:
		return releaseError(st)
	case <-ctx.Done():
		select {
		case st := <-finished: // both ready: the outcome is known, say it
			return releaseError(st)
		default:
			return ctx.Err()
		}
	}
}

// start runs a blocking C call: here when ctx can never end, else on a goroutine of its own, so
// that the caller can stop waiting for it when ctx ends (the call still completes).
func start(ctx context.Context, run func()) {
	if ctx.Done() == nil {
		run()
	} else {
		go run()
	}
}

func releaseError(st C.int) error {
	if st != C.SLUICE_OK {
		return statusError(st)
	}
	return nil
}

// Held is a lease granted by Acquire, given back by its Release. A nil *Held holds nothing:
// its Release does nothing, so `defer h.Release(ctx)` needs no test. Safe for concurrent use.
type Held struct {
	c     *Client
	chk   Check // a copy: the caller may reuse its Entries
	lease uint64
	done  atomic.Bool // Release was called
}

// Acquire is CheckEntries plus a *Held for the lease the check was granted: nil when none was
// (denied, no concurrency limit applied, no node decided: a fail-open result holds no slot, a
// check of 0 Hits takes none, or err is not nil). A denied check is not an error: look at
// r.Allowed, as after CheckEntries.
//
//	h, r, err := c.Acquire(ctx, sluice.Check{Domain: "jobs", Entries: entries, Hits: 1})
//	if err != nil { return err }
//	if !r.Allowed { return reply429(r.RetryAfterMs()) }
//	defer h.Release(context.Background())
func (c *Client) Acquire(ctx context.Context, chk Check) (*Held, Result, error) {
	r, err := c.CheckEntries(ctx, chk)
	if err != nil || r.Lease == 0 {
		return nil, r, err
	}
	return &Held{c: c, chk: chk.clone(), lease: r.Lease}, r, nil
}

// Lease is the id held (0 for a nil Held); it stays readable after Release.
func (h *Held) Lease() uint64 {
	if h == nil {
		return 0
	}
	return h.lease
}

// Release gives the lease back (Client.Release, with ctx bounding only the wait); only the first
// call sends, later ones (and a nil Held's) return nil. It returns nil when the lease holds
// nothing any more: released now, before (ErrLeaseReleased: by a Client.Release of its id, or
// a retry whose first answer was lost) or expired (ErrLeaseExpired: the work outlasted
// lease_ttl); else Client.Release's error (ErrUnavailable, ErrLeaseUnknown, ctx.Err(), ...:
// the lease is then held until its lease_ttl is over, unless the release still arrives).
func (h *Held) Release(ctx context.Context) error {
	if h == nil || h.done.Swap(true) {
		return nil
	}
	err := h.c.Release(ctx, h.chk, h.lease)
	if errors.Is(err, ErrLeaseReleased) || errors.Is(err, ErrLeaseExpired) {
		return nil
	}
	return err
}

// Stats are libsluice's counters since New.
type Stats struct {
	Checks, Requests, Retries, Answers, DroppedAnswers, Unavailable, LinkFailures,
	CallbackExceptions uint64
}

func (c *Client) Stats() (Stats, error) {
	var s C.sluice_stats
	s.struct_size = C.sizeof_sluice_stats
	c.mu.RLock()
	st := C.sluice_client_stats(c.c, &s)
	c.mu.RUnlock()
	if st != C.SLUICE_OK {
		return Stats{}, statusError(st)
	}
	return Stats{uint64(s.checks), uint64(s.requests), uint64(s.retries), uint64(s.answers),
		uint64(s.dropped_answers), uint64(s.unavailable), uint64(s.link_failures),
		uint64(s.callback_exceptions)}, nil
}

func (c *Client) ctxResult() Result {
	return Result{Status: ErrUnavailable.Status, Outcome: Unavailable, Allowed: c.failMode == FailOpen}
}

//export sluiceGoDone
func sluiceGoDone(r *C.sluice_result, handle C.uintptr_t) {
	h := cgo.Handle(handle)
	done := h.Value().(chan Result)
	h.Delete()
	done <- convert(r) // buffered: never blocks libsluice's thread
}

func answer(st C.int, r *C.sluice_result) (Result, error) {
	res := convert(r)
	if !answers(Status(st)) {
		return res, statusError(st)
	}
	return res, nil
}

var modes = [...]string{"enforce", "dry-run", "shadow"}

func convert(r *C.sluice_result) Result {
	res := Result{
		Status: Status(r.status), Outcome: Outcome(r.outcome), Allowed: r.allowed != 0,
		WouldDeny: r.would_deny != 0, Shadow: r.shadow != 0, Allowlisted: r.allowlisted != 0,
		Truncated: r.truncated != 0, Lease: uint64(r.lease),
	}
	n := int(r.num_limits)
	if n > 0 {
		res.Limits = make([]Limit, n)
		for i := 0; i < n; i++ {
			l := &r.limits[i]
			mode := "enforce"
			if int(l.mode) >= 0 && int(l.mode) < len(modes) {
				mode = modes[l.mode]
			}
			res.Limits[i] = Limit{
				Name: C.GoString(&l.name[0]), Limit: uint64(l.limit), WindowMs: int64(l.window_ms),
				Remaining: uint64(l.remaining), ResetMs: int64(l.reset_ms),
				RetryAfterMs: int64(l.retry_after_ms), Mode: mode, Exceeded: l.exceeded != 0,
			}
		}
	}
	return res
}

func validate(chk Check) *Error {
	if len(chk.Entries) > C.SLUICE_MAX_ENTRIES {
		return ErrTooManyEntries
	}
	if hasNul(chk.Domain) {
		return &Error{Status: ErrInvalidArgument.Status, Message: "domain contains a NUL byte"}
	}
	for _, e := range chk.Entries {
		if hasNul(e.Key) || hasNul(e.Value) {
			return &Error{Status: ErrInvalidArgument.Status, Message: "an entry contains a NUL byte"}
		}
	}
	return nil
}

func hasNul(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// cChecks is checks laid out in one C allocation: the sluice_check array, the sluice_entry
// arrays, then every string NUL-terminated. One malloc per call; cgo forbids C holding Go
// pointers, so the strings must be copied anyway.
type cChecks struct {
	block  unsafe.Pointer
	checks *C.sluice_check
}

func marshal(checks []Check) (cChecks, *Error) {
	nEntries, nBytes := 0, 0
	for _, chk := range checks {
		if err := validate(chk); err != nil {
			return cChecks{}, err
		}
		nEntries += len(chk.Entries)
		nBytes += len(chk.Domain) + 1
		for _, e := range chk.Entries {
			nBytes += len(e.Key) + len(e.Value) + 2
		}
	}
	checkBytes := len(checks) * C.sizeof_sluice_check
	entryBytes := nEntries * C.sizeof_sluice_entry
	block := C.malloc(C.size_t(checkBytes + entryBytes + nBytes))
	if block == nil {
		return cChecks{}, ErrNoMemory
	}
	cs := unsafe.Slice((*C.sluice_check)(block), len(checks))
	es := unsafe.Slice((*C.sluice_entry)(unsafe.Add(block, checkBytes)), nEntries)
	text := unsafe.Slice((*byte)(unsafe.Add(block, checkBytes+entryBytes)), nBytes)
	pos, ei := 0, 0
	str := func(s string) *C.char {
		p := (*C.char)(unsafe.Pointer(&text[pos]))
		pos += copy(text[pos:], s)
		text[pos] = 0
		pos++
		return p
	}
	for i, chk := range checks {
		cs[i].domain = str(chk.Domain)
		cs[i].num_entries = C.size_t(len(chk.Entries))
		cs[i].hits = C.int64_t(chk.Hits)
		cs[i].entries = nil
		if len(chk.Entries) > 0 {
			cs[i].entries = &es[ei]
		}
		for _, e := range chk.Entries {
			es[ei].key = str(e.Key)
			es[ei].value = str(e.Value)
			ei++
		}
	}
	return cChecks{block: block, checks: &cs[0]}, nil
}

// Status is a sluice_status.
type Status int

// Error is a libsluice status other than SLUICE_OK.
type Error struct {
	Status  Status
	Message string // libsluice's detail (create), else sluice_strerror
}

func (e *Error) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("sluice: %s", e.Message)
	}
	return "sluice: " + C.GoString(C.sluice_strerror(C.int(e.Status)))
}

// Is matches errors of the same status: errors.Is(err, sluice.ErrUnknownDomain).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status
}

// One error per sluice_status (sluice.h).
var (
	ErrInvalidArgument = &Error{Status: C.SLUICE_ERR_INVALID_ARGUMENT}
	ErrNoMemory        = &Error{Status: C.SLUICE_ERR_NO_MEMORY}
	ErrBadNode         = &Error{Status: C.SLUICE_ERR_BAD_NODE}
	ErrInCallback      = &Error{Status: C.SLUICE_ERR_IN_CALLBACK}
	ErrUnavailable     = &Error{Status: C.SLUICE_ERR_UNAVAILABLE}
	ErrRefused         = &Error{Status: C.SLUICE_ERR_REFUSED}
	ErrEmptyDomain     = &Error{Status: C.SLUICE_ERR_EMPTY_DOMAIN}
	ErrUnknownDomain   = &Error{Status: C.SLUICE_ERR_UNKNOWN_DOMAIN}
	ErrTooManyEntries  = &Error{Status: C.SLUICE_ERR_TOO_MANY_ENTRIES}
	ErrEntryTooLong    = &Error{Status: C.SLUICE_ERR_ENTRY_TOO_LONG}
	ErrEmptyEntryKey   = &Error{Status: C.SLUICE_ERR_EMPTY_ENTRY_KEY}
	ErrDuplicateEntry  = &Error{Status: C.SLUICE_ERR_DUPLICATE_ENTRY}
	ErrHitsTooLarge    = &Error{Status: C.SLUICE_ERR_HITS_TOO_LARGE}
	ErrNegativeHits    = &Error{Status: C.SLUICE_ERR_NEGATIVE_HITS}
	ErrNoRoom          = &Error{Status: C.SLUICE_ERR_NO_ROOM}
	ErrTooLarge        = &Error{Status: C.SLUICE_ERR_TOO_LARGE}
	// Release: a node answered and nothing changed.
	ErrLeaseUnknown  = &Error{Status: C.SLUICE_ERR_LEASE_UNKNOWN}  // not a lease of these entries
	ErrLeaseExpired  = &Error{Status: C.SLUICE_ERR_LEASE_EXPIRED}  // its lease_ttl was over
	ErrLeaseReleased = &Error{Status: C.SLUICE_ERR_LEASE_RELEASED} // released before
	// ErrClosed: a call after Close (libsluice sees a NULL client: invalid argument).
	ErrClosed = ErrInvalidArgument
)

// Statuses that are answers (a node or the fail mode decided), not errors.
func answers(s Status) bool {
	return s == 0 || s == ErrUnavailable.Status || s == ErrRefused.Status || s == ErrNoRoom.Status
}

func statusError(st C.int) error {
	return &Error{Status: Status(st)}
}
