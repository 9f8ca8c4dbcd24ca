// sluice-bench-go: checks/s of the Go client against a running node, one calling goroutine.
//
//	sluice-bench-go -server H:P -batch 1|N [-seconds 2] [-ctx]
//
// Prints one JSON object like sluice-bench-client-native's. Run by bench/client_bench.py.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"sluice"
)

const maxChecks = 20_000_000

func main() {
	server := flag.String("server", "127.0.0.1:7350", "node")
	batch := flag.Int("batch", 1, "checks per call (1..1024)")
	seconds := flag.Float64("seconds", 2, "how long (0, 60]")
	withDeadline := flag.Bool("ctx", false, "a context with a deadline (the async path)")
	flag.Parse()
	if *batch < 1 || *batch > 1024 || *seconds <= 0 || *seconds > 60 {
		fmt.Fprintln(os.Stderr, "-batch 1..1024, -seconds (0, 60]")
		os.Exit(2)
	}
	c, err := sluice.New(sluice.Options{Nodes: []string{*server}, Timeout: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer c.Close()
	users := make([]string, 1000)
	for i := range users {
		users[i] = fmt.Sprintf("u%d", i)
	}
	ctx := context.Background()
	if *withDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Hour)
		defer cancel()
	}
	var checks, undecided, n int
	start := time.Now()
	until := start.Add(time.Duration(*seconds * float64(time.Second)))
	checksBuf := make([]sluice.Check, *batch)
	for time.Now().Before(until) && checks < maxChecks {
		if *batch == 1 {
			r, _ := c.Check(ctx, "b", map[string]string{"user": users[n%1000]})
			if !r.Decided() {
				undecided++
			}
		} else {
			for i := range checksBuf {
				checksBuf[i] = sluice.Check{Domain: "b", Entries: []sluice.Entry{{Key: "user", Value: users[(n+i)%1000]}}, Hits: 1}
			}
			rs, _ := c.CheckBatch(ctx, checksBuf)
			for _, r := range rs {
				if !r.Decided() {
					undecided++
				}
			}
		}
		n += *batch
		checks += *batch
	}
	took := time.Since(start).Seconds()
	lang := "go"
	if *withDeadline {
		lang = "go-ctx"
	}
	out, _ := json.Marshal(map[string]any{"lang": lang, "batch": *batch, "checks": checks,
		"seconds": float64(int(took*1000)) / 1000, "checks_per_s": int(float64(checks) / took),
		"undecided": undecided})
	fmt.Println(string(out))
}
