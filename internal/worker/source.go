package worker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/go-logr/logr"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
)

// Source is where a shard's items come from.
type Source interface {
	// open starts reading the items of shard (of shards) in an order where
	// every repeat of a key directly follows its first copy.
	// The batch is fixed in the ledger database the first time a shard of
	// the run opens it; later opens read that same batch, or fail.
	open(ctx context.Context, store *ledger.Store, shard, shards int, opt streamOptions) (stream, error)
	// describe names the source for logs and errors.
	describe() string
}

type streamOptions struct {
	run ledger.Run // UID tells this run's rows from others' (HolderSameRun)
	// heldPayloads: a row a lookup settles keeps its payload (a Supersede
	// run claims it again; a Fail run's failure record of a key keeps its
	// first copy's, which a later copy's change may fail).
	heldPayloads bool
	fetchSize    int
	retry        Backoff
	limits       Limits
	timeouts     v1alpha1.RunTimeouts
	log          logr.Logger
	// retried, if set, is told about each retryable error of the stream's
	// own reads.
	retried func(error)
	// copyBatch: the caller holds none of the store's connections and
	// needs none until open returns (ledger.BatchQuery.Copy).
	copyBatch bool
}

// entry is one declared item as a stream yields it.
type entry struct {
	item ledger.Item
	// repeat: a later copy of the key of the entry just before it (which the
	// stream yielded earlier, possibly in a previous chunk).
	repeat bool
	// bad: the row could not become an item; it counts as failed, with this
	// error, and is never committed.
	bad *InputError
	// checked: the source already asked the ledger who holds the key (a
	// query source joins the ledger), so the chunk needs no preload for it;
	// holder is the answer (HolderNone: not committed when the source read it).
	checked bool
	holder  ledger.Holder
	payload ledger.PayloadMatch // for HolderOtherRun
	// omitted: the lookup settled the row and its payload was left out
	// (item.Payload is nil whatever it was).
	omitted bool
	// direct: the source looked the key up on purpose not (none of its
	// recent keys was held): no preload either, the claim finds the holder.
	direct bool
}

type stream interface {
	// next returns the next entry, or io.EOF after the last one.
	next(ctx context.Context) (entry, error)
	// sawHeld is told, after each chunk, whether its claim found any key
	// committed already (a stream that looks keys up may stop or resume).
	sawHeld(held bool)
	// total returns how many entries the stream has (known) or has yielded
	// so far (not known yet).
	total() (n int64, known bool)
	close()
	// proofKeys is what ProveShard proves: the shard's part of the batch
	// kept in the database (kept), or its keys (a copy each).
	proofKeys() (kept bool, keys []ledger.Key)
}

// StaticSource is a validated batch held in memory: inline items or a JSON
// Lines document (a ConfigMap or a file).
type StaticSource struct {
	name  string
	items []ledger.Item
}

// NewStaticSource returns a source over items, which the caller validated
// (ValidateItems, ParseJSONLines). name describes it in logs.
func NewStaticSource(name string, items []ledger.Item) *StaticSource {
	return &StaticSource{name: name, items: items}
}

// Items returns the batch.
func (s *StaticSource) Items() []ledger.Item { return s.items }

func (s *StaticSource) describe() string { return s.name }

func (s *StaticSource) open(ctx context.Context, store *ledger.Store, shard, shards int, opt streamOptions) (stream, error) {
	if err := fixStaticBatch(ctx, store, opt, shards, s.items); err != nil {
		return nil, err
	}
	return &sliceStream{entries: groupRepeats(s.items, shard, shards)}, nil
}

// groupRepeats returns the items of shard, in declared order of their first
// copy, each repeat moved right after the first copy of its key.
func groupRepeats(items []ledger.Item, shard, shards int) []entry {
	first := make(map[ledger.Key]int) // key -> index of its group
	var groups [][]ledger.Item
	for _, it := range items {
		if ledger.ShardOf(it.Key, shards) != shard {
			continue
		}
		g, ok := first[it.Key]
		if !ok {
			g = len(groups)
			first[it.Key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], it)
	}
	out := make([]entry, 0, len(items))
	for _, g := range groups {
		for i, it := range g {
			out = append(out, entry{item: it, repeat: i > 0})
		}
	}
	return out
}

type sliceStream struct {
	entries []entry
	pos     int
}

func (s *sliceStream) next(context.Context) (entry, error) {
	if s.pos >= len(s.entries) {
		return entry{}, io.EOF
	}
	s.pos++
	return s.entries[s.pos-1], nil
}

func (s *sliceStream) total() (int64, bool) { return int64(len(s.entries)), true }
func (s *sliceStream) close()               {}
func (s *sliceStream) sawHeld(bool)         {}

// proofKeys: a static batch is not kept in the database; its shard's keys,
// each copy, are the proof's.
func (s *sliceStream) proofKeys() (bool, []ledger.Key) {
	keys := make([]ledger.Key, len(s.entries))
	for i, e := range s.entries {
		keys[i] = e.item.Key
	}
	return false, keys
}

// ParseJSONLines reads a JSON Lines batch held whole (a ConfigMap or a
// file): one JSON object per line (batchitem.ParseLine says which), blank
// lines ignored. The whole input is validated before anything is returned:
// the error, an *InputErrors, lists every problem with its line number and
// field. name describes the input in errors. (internal/batchfile streams a
// batch too large to hold, with the same rules.)
func ParseJSONLines(r io.Reader, name string, l Limits) ([]ledger.Item, error) {
	errs := &InputErrors{Source: name}
	var items []ledger.Item
	maxLine := batchitem.MaxLine(l)
	br := bufio.NewReaderSize(r, 64*1024)
	for lineNo := 1; ; lineNo++ {
		line, tooLong, err := batchitem.ReadLine(br, maxLine)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("reading %s at line %d: %w", name, lineNo, err)
		}
		where := fmt.Sprintf("line %d", lineNo)
		switch {
		case tooLong:
			errs.Add(batchitem.LineTooLong(where, l))
		case !batchitem.IsBlank(line):
			it, problems := batchitem.ParseLine(line, where, l)
			for _, p := range problems {
				errs.Add(p)
			}
			if len(problems) == 0 {
				items = append(items, it)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if errs.Count == 0 && len(items) == 0 {
		errs.Add(&InputError{Msg: "holds no items (expected one JSON object per line)"})
	}
	if err := errs.OrNil(); err != nil {
		return nil, err
	}
	return items, nil
}
