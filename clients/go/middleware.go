package sluice

import (
	"net/http"
	"strconv"
)

// Middleware rate-limits an http.Handler: each request is checked in `domain` with the entries
// `key` picks from it (say, the API key header); a denied request gets 429 with Retry-After, an
// allowed one goes on with RateLimit-* headers of its tightest limit. The check is bounded by the
// client's timeout and the request's context; when no node decides, the client's fail mode does.
// A bad check (an unknown domain: a configuration mismatch) is a 500, never a silent pass.
//
//	limited := sluice.Middleware(client, "api", func(r *http.Request) map[string]string {
//		return map[string]string{"api_key": r.Header.Get("X-Api-Key")}
//	})
//	http.ListenAndServe(":8080", limited(mux))
func Middleware(c *Client, domain string, key func(*http.Request) map[string]string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r, err := c.Check(req.Context(), domain, key(req))
			if err != nil && req.Context().Err() == nil {
				http.Error(w, "rate limit check failed", http.StatusInternalServerError)
				return
			}
			if !r.Allowed {
				wait := r.RetryAfterMs()
				secs := int64(60)
				if wait > 0 {
					secs = (wait + 999) / 1000
				}
				w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
				http.Error(w, "rate limited", http.StatusTooManyRequests)
				return
			}
			if len(r.Limits) > 0 {
				tight := r.Limits[0]
				for _, l := range r.Limits[1:] {
					if l.Remaining < tight.Remaining {
						tight = l
					}
				}
				h := w.Header()
				h.Set("RateLimit-Limit", strconv.FormatUint(tight.Limit, 10))
				h.Set("RateLimit-Remaining", strconv.FormatUint(tight.Remaining, 10))
				h.Set("RateLimit-Reset", strconv.FormatInt((tight.ResetMs+999)/1000, 10))
			}
			next.ServeHTTP(w, req)
		})
	}
}
