package monitoring

import (
	"context"
	"path/filepath"
	"time"

	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

// NewEngine is a PromQL engine as Prometheus runs it by default (5 minutes
// of lookback).
func NewEngine() *promql.Engine {
	return promql.NewEngine(promql.EngineOpts{
		MaxSamples:    10_000_000,
		Timeout:       time.Minute,
		LookbackDelta: 5 * time.Minute,
		Parser:        Parser,
	})
}

// Range evaluates expr from start to end every step.
func Range(ctx context.Context, e *promql.Engine, q storage.Queryable, expr string, start, end time.Time, step time.Duration) (promql.Matrix, error) {
	qry, err := e.NewRangeQuery(ctx, q, nil, expr, start, end, step)
	if err != nil {
		return nil, err
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		return nil, res.Err
	}
	return res.Matrix()
}

// OpenTimeline loads a timeline's scrapes from dir into a new TSDB under
// tmp, recording the series in inv (nil: not recorded). It returns the
// database and the number of steps.
func OpenTimeline(ctx context.Context, dir, timeline, tmp string, inv Inventory) (*tsdb.DB, int, error) {
	scrapes, err := ListScrapes(dir, timeline)
	if err != nil {
		return nil, 0, err
	}
	db, err := tsdb.Open(filepath.Join(tmp, timeline), promslog.NewNopLogger(), nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		return nil, 0, err
	}
	if err := Load(db.Appender(ctx), scrapes, inv); err != nil {
		_ = db.Close()
		return nil, 0, err
	}
	return db, Steps(scrapes), nil
}
