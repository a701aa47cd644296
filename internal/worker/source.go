package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/go-logr/logr"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/strictjson"
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

// ParseJSONLines reads a JSON Lines batch: one JSON object per line,
//
//	{"entity": "acct-1", "occurrence": "2024-06", "payload": {"amount": 12.5}}
//
// with entity and occurrence non-empty strings and payload optional (any JSON
// value). Blank lines are ignored; any other field is an error (a misspelt
// field would otherwise silently drop data). The whole input is validated
// before anything is returned: the error, an *InputErrors, lists every
// problem with its line number and field. name describes the input in errors.
func ParseJSONLines(r io.Reader, name string, l Limits) ([]ledger.Item, error) {
	errs := &InputErrors{Source: name}
	var items []ledger.Item
	// A line holds a payload and its key, plus JSON syntax.
	maxLine := l.maxPayload() + 2*v1alpha1.MaxKeyPartBytes + 4096
	br := bufio.NewReaderSize(r, 64*1024)
	for lineNo := 1; ; lineNo++ {
		line, tooLong, err := readLine(br, maxLine)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("reading %s at line %d: %w", name, lineNo, err)
		}
		where := fmt.Sprintf("line %d", lineNo)
		switch {
		case tooLong:
			errs.add(&InputError{Where: where, Msg: fmt.Sprintf("is longer than %s (the payload limit is %s)", byteSize(maxLine), byteSize(l.maxPayload()))})
		case len(bytes.TrimSpace(line)) > 0:
			it, problems := parseLine(line, where, l)
			for _, p := range problems {
				errs.add(p)
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
		errs.add(&InputError{Msg: "holds no items (expected one JSON object per line)"})
	}
	if err := errs.orNil(); err != nil {
		return nil, err
	}
	return items, nil
}

// readLine returns the next line without its end of line. When the line is
// longer than max, it is consumed and reported as tooLong. err is io.EOF with
// the last line.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > max+2 { // + "\r\n"
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			return trimEOL(buf), tooLong, err
		}
		return trimEOL(buf), tooLong, nil
	}
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

var jsonlFields = []string{"entity", "occurrence", "payload"}

func parseLine(line []byte, where string, l Limits) (ledger.Item, []*InputError) {
	// Strict first: encoding/json would turn invalid UTF-8 and lone
	// surrogates into U+FFFD (two keys into one) and keep the last of a
	// field given twice.
	if p := strictProblem(where, strictjson.Check(line)); p != nil {
		return ledger.Item{}, []*InputError{p}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return ledger.Item{}, []*InputError{{Where: where, Msg: fmt.Sprintf("is a JSON %s, not an object with entity, occurrence and payload", typeErr.Value)}}
		}
		return ledger.Item{}, []*InputError{{Where: where, Msg: "is not valid JSON: " + err.Error()}}
	}
	if obj == nil { // the line is `null`
		return ledger.Item{}, []*InputError{{Where: where, Msg: "is null, not an object with entity, occurrence and payload"}}
	}
	var problems []*InputError
	var unknown []string
	for k := range obj {
		if k != "entity" && k != "occurrence" && k != "payload" {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		problems = append(problems, &InputError{Where: where, Field: k, Msg: "is not a known field (want " + strings.Join(jsonlFields, ", ") + ")"})
	}
	var it ledger.Item
	for _, f := range []struct {
		name string
		dst  *string
	}{{"entity", &it.Entity}, {"occurrence", &it.Occurrence}} {
		raw, ok := obj[f.name]
		switch {
		case !ok:
			problems = append(problems, &InputError{Where: where, Field: f.name, Msg: "is missing"})
		case string(raw) == "null":
			problems = append(problems, &InputError{Where: where, Field: f.name, Msg: "is null"})
		case json.Unmarshal(raw, f.dst) != nil:
			problems = append(problems, &InputError{Where: where, Field: f.name, Msg: "must be a string, not " + string(abbreviate(raw, 40))})
		default:
			if msg := v1alpha1.KeyPartProblem(*f.dst); msg != "" {
				problems = append(problems, &InputError{Where: where, Field: f.name, Msg: msg})
			}
		}
	}
	if raw, ok := obj["payload"]; ok && string(raw) != "null" {
		if msg := checkPayload(raw, l); msg != "" {
			problems = append(problems, &InputError{Where: where, Field: "payload", Msg: msg})
		}
		it.Payload = raw // json.Unmarshal copied it out of the line
	}
	return it, problems
}

func abbreviate(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append(append([]byte(nil), b[:n]...), "..."...)
}
