package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"runtime/debug"
	"strconv"
	"time"
)

// reqInfo is what the middleware learns of a request on its way through.
type reqInfo struct {
	id     string
	tenant string
	// route is the pattern the mux matched. The mux sets it on the
	// request it serves, which middleware may have copied (a paced body),
	// so it comes back here rather than on the request observe holds.
	route string
}

type reqInfoKey struct{}

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

func requestID(ctx context.Context) string {
	if ri, ok := ctx.Value(reqInfoKey{}).(*reqInfo); ok {
		return ri.id
	}
	return ""
}

func setLogTenant(ctx context.Context, t string) {
	if ri, ok := ctx.Value(reqInfoKey{}).(*reqInfo); ok {
		ri.tenant = t
	}
}

// recorder remembers the status and size of a response. It passes Flush
// through (server-sent events need it).
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *recorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// observe gives every request an id (the client's X-Request-Id if it is
// sane) and a span (trace.go), logs it as one JSON line when it ends (with
// its trace id when it is traced), and counts it.
func (s *Server) observe(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get("X-Request-Id")
		if !requestIDPattern.MatchString(id) {
			b := make([]byte, 8)
			rand.Read(b)
			id = hex.EncodeToString(b)
		}
		ri := &reqInfo{id: id}
		w.Header().Set("X-Request-Id", id)
		rec := &recorder{ResponseWriter: w}
		ctx, span := startSpan(context.WithValue(r.Context(), reqInfoKey{}, ri), r)
		r = r.WithContext(ctx)
		h.ServeHTTP(rec, r) // the mux sets r.Pattern
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		route := ri.route
		if route == "" {
			route = "unmatched"
		}
		s.opt.Metrics.requests.WithLabelValues(r.Method, route, strconv.Itoa(rec.status)).Inc()
		endSpan(span, ri, r.Method, rec.status, rec.bytes)
		level := slog.LevelInfo
		switch {
		case rec.status >= 500:
			level = slog.LevelError
		case quiet(r.URL.Path):
			level = slog.LevelDebug
		}
		attrs := []slog.Attr{
			slog.String("request_id", id), slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("route", route), slog.Int("status", rec.status), slog.Int64("bytes", rec.bytes),
			slog.Float64("duration_ms", since(start)), slog.String("tenant", ri.tenant),
			slog.String("remote", r.RemoteAddr),
		}
		if sc := span.SpanContext(); sc.IsValid() {
			attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
		}
		s.log.LogAttrs(r.Context(), level, "request", attrs...)
	})
}

// recoverPanics turns a handler's panic into a 500 and a log line with the
// stack, instead of a dropped connection.
func (s *Server) recoverPanics(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("handler panic", "request_id", requestID(r.Context()), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				s.writeError(w, r, fmt.Errorf("panic: %v", v))
			}
		}()
		h.ServeHTTP(w, r)
	})
}
