// Command processor is the soak's processor (spec.effect.processor of its
// processor runs): for every item it is sent it first appends a row to
// soak_processor_log (autocommit, outside the worker's transaction: every
// request is kept, also those whose chunk never commits), then does the
// item's work once per idempotency key (soak_processor_work, the key its
// primary key: a key sent again is answered ok without new work, as a
// payment API's Idempotency-Key would be).
//
// The soak's nemesis makes it misbehave through soak_fault, read at most
// every 500 ms: kind "crash" exits the process after the work was done and
// before the answer is sent (the worst moment: work done, no ok), kind
// "slow" sleeps before answering (beyond the run's processor timeout, the
// call is abandoned), each for a share "rate" of the calls until "until".
//
//	processor -listen :8080        (the DSN in $SOAK_DSN)
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/pkg/processor"
)

func main() {
	listen := flag.String("listen", ":8080", "address to listen on (all interfaces: the kubelet probes the port)")
	flag.Parse()
	dsn := os.Getenv("SOAK_DSN")
	if dsn == "" {
		log.Fatal("SOAK_DSN is not set")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		log.Fatalf("parse SOAK_DSN: %v", err)
	}
	cfg.MaxConns = 2
	// The server drops the session of a processor whose node was lost within
	// seconds, as the worker's own sessions are: else the soak sees it as a leak.
	for k, v := range map[string]string{"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3", "tcp_user_timeout": "10000"} {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "soak-processor"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		log.Fatalf("connect: %v", err)
	}
	s := &server{pool: pool}
	process := processor.Handler(s.item)
	mux := http.NewServeMux()
	mux.Handle("POST /process", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := s.faults(r.Context())
		if f.slow > 0 && rand.Float64() < f.slowRate {
			time.Sleep(f.slow)
		}
		rec := httptest.NewRecorder()
		process.ServeHTTP(rec, r)
		if rand.Float64() < f.crashRate {
			log.Printf("crashing after the work, before the answer (soak fault)")
			os.Exit(3)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("listening on %s", *listen)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

type server struct {
	pool *pgxpool.Pool

	mu     sync.Mutex
	read   time.Time
	active faults
}

type faults struct {
	crashRate, slowRate float64
	slow                time.Duration
}

// faults are the nemesis' orders in force, read at most every 500 ms.
func (s *server) faults(ctx context.Context) faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.read) < 500*time.Millisecond {
		return s.active
	}
	s.read = time.Now()
	var f faults
	rows, err := s.pool.Query(ctx, `SELECT kind, rate, seconds FROM soak_fault WHERE until > now()`)
	if err != nil {
		return s.active // the database is away (a fault too): keep the last orders
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var rate, seconds float64
		if rows.Scan(&kind, &rate, &seconds) != nil {
			continue
		}
		switch kind {
		case "crash":
			f.crashRate = rate
		case "slow":
			f.slowRate, f.slow = rate, time.Duration(seconds*float64(time.Second))
		}
	}
	if rows.Err() == nil {
		s.active = f
	}
	return s.active
}

// item logs the request, then does the work once per key.
func (s *server) item(ctx context.Context, req *processor.Request, it processor.Item) processor.Result {
	if _, err := s.pool.Exec(ctx, `INSERT INTO soak_processor_log (key, entity, occurrence, run, run_uid, shard, attempt) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		it.Key, it.Entity, it.Occurrence, req.Run.Name, req.Run.UID, req.Shard, req.Attempt); err != nil {
		return processor.Retry(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO soak_processor_work (key, entity, occurrence, run) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING`,
		it.Key, it.Entity, it.Occurrence, req.Run.Name); err != nil {
		return processor.Retry(err)
	}
	return processor.OK()
}
