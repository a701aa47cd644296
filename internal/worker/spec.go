package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// Plan is a run's spec made ready to execute: what every shard needs except
// its index and attempt.
type Plan struct {
	Run    ledger.Run // Namespace, Name, UID
	Shards int
	Source Source
	Effect string
	// Processor is the run's processor (spec.effect.processor), called at
	// ProcessorSpec.URL() unless the caller points it elsewhere
	// (UseProcessorURL).
	Processor *HTTPProcessor
	// ItemsPerCall and CallsInFlight bound the processor's calls of a
	// chunk (spec.effect.processor.maxItemsPerCall, maxCallsInFlight).
	ItemsPerCall, CallsInFlight int
	OnExisting                  ledger.OnExisting
	// FailOnPayloadChange: spec.onPayloadChange is Fail.
	FailOnPayloadChange bool
	ChunkSize           int
	MaxFailedItems      int
	Timeouts            v1alpha1.RunTimeouts
}

// ShardConfig returns the configuration of one shard of the plan.
func (p *Plan) ShardConfig(shard, attempt int) ShardConfig {
	run := p.Run
	run.Shard, run.Attempt = shard, attempt
	var proc ledger.Processor
	if p.Processor != nil {
		proc = p.Processor
	}
	return ShardConfig{
		Processor:           proc,
		ItemsPerCall:        p.ItemsPerCall,
		CallsInFlight:       p.CallsInFlight,
		Run:                 run,
		Shards:              p.Shards,
		Source:              p.Source,
		Effect:              p.Effect,
		OnExisting:          p.OnExisting,
		FailOnPayloadChange: p.FailOnPayloadChange,
		ChunkSize:           p.ChunkSize,
		MaxFailedItems:      p.MaxFailedItems,
		Timeouts:            p.Timeouts,
	}
}

// BatchData fetches the data of a ConfigMap key the run names: the JSON
// Lines document of batch.configMapRef, the CA bundle of
// batch.object.caConfigMapRef (a file mounted in a pod, a file or the
// manifest on a laptop). It returns the data and a name for it in errors.
type BatchData func(ctx context.Context, ref v1alpha1.ConfigMapKeyRef) (data []byte, name string, err error)

// LocalRunUID is the identity of a run without a metadata.uid (a manifest run
// by `runledger run`): a name-based UUID (version 5) of its namespace and
// name, the same at every invocation, so that a killed and restarted local
// run counts what it committed before as completed.
func LocalRunUID(namespace, name string) string {
	return uuid.NewSHA1(localRunSpace, []byte(namespace+"/"+name)).String()
}

// localRunSpace is the UUID namespace of LocalRunUID (itself the version 5
// UUID of "runledger.dev/local-run" in the URL namespace). Never change it.
var localRunSpace = uuid.MustParse("84c5fb6f-68c3-5321-8cb5-bddc4993e811")

// NewPlan builds the plan of a run that passed the CRD's validation (the
// apiserver's, or internal/admission's for `runledger run`). Inline items and
// JSON Lines are parsed and validated completely here, before any commit: a
// problem with the batch is an *InputErrors / *InputError (IsInputError).
func NewPlan(ctx context.Context, run *v1alpha1.ProcessingRun, data BatchData, l Limits) (*Plan, error) {
	spec := &run.Spec
	p := &Plan{
		Run:                 ledger.Run{Namespace: run.Namespace, Name: run.Name, UID: string(run.UID)},
		Shards:              int(spec.ShardCount()),
		ChunkSize:           int(spec.ChunkSizeOrDefault()),
		MaxFailedItems:      int(spec.MaxFailedItems),
		Timeouts:            v1alpha1.TimeoutsOf(spec),
		FailOnPayloadChange: spec.PayloadChangePolicy() == v1alpha1.OnPayloadChangeFail,
	}
	if p.Run.Namespace == "" {
		p.Run.Namespace = "default"
	}
	if p.Run.UID == "" {
		p.Run.UID = LocalRunUID(p.Run.Namespace, p.Run.Name)
	}
	if spec.OnExisting == v1alpha1.OnExistingSupersede {
		p.OnExisting = ledger.Supersede
	}
	if spec.Effect != nil {
		p.Effect = strings.TrimSpace(spec.Effect.SQL)
		if proc := spec.Effect.Processor; proc != nil {
			p.Processor = NewHTTPProcessor(proc.URL(), proc.CallTimeout())
			// A chunk of chunkSize items, its calls of at most
			// ItemsPerCall, CallsInFlight at once: a processor run pays one
			// commit per chunk, not one per call (#48).
			p.ItemsPerCall, p.CallsInFlight = proc.ItemsPerCall(), proc.CallsInFlight()
		}
	}
	switch b := spec.Batch; {
	case len(b.Items) > 0:
		items := make([]ledger.Item, len(b.Items))
		for i, it := range b.Items {
			items[i] = ledger.Item{Key: ledger.Key{Entity: it.Entity, Occurrence: it.Occurrence}}
			if it.Payload != nil && len(it.Payload.Raw) > 0 && string(it.Payload.Raw) != "null" {
				items[i].Payload = it.Payload.Raw
			}
		}
		withOccurrence(items, spec.Occurrence)
		if err := ValidateItems(items, func(i int) string { return fmt.Sprintf("spec.batch.items[%d]", i) }, l); err != nil {
			return nil, err
		}
		p.Source = NewStaticSource("spec.batch.items", items)
	case b.ConfigMapRef != nil:
		raw, name, err := data(ctx, *b.ConfigMapRef)
		if err != nil {
			return nil, err
		}
		items, err := ParseJSONLines(bytes.NewReader(raw), name, l)
		if err != nil {
			return nil, err
		}
		if withOccurrence(items, spec.Occurrence) {
			// The occurrence may have made a key part too long.
			if err := ValidateItems(items, func(i int) string { return fmt.Sprintf("%s item %d", name, i+1) }, l); err != nil {
				return nil, err
			}
		}
		p.Source = NewStaticSource(name, items)
	case b.Object != nil:
		var ca []byte
		if ref := b.Object.CAConfigMapRef; ref != nil {
			raw, _, err := data(ctx, *ref)
			if err != nil {
				return nil, err
			}
			ca = raw
		}
		obj, err := objectAt(*b.Object, spec.Occurrence)
		if err != nil {
			return nil, err
		}
		p.Source = NewObjectSource(obj, ca, spec.Occurrence)
	case b.FromRun != nil:
		if v := b.FromRun.VerdictOrDefault(); v != v1alpha1.FromRunFailed {
			return nil, &InputError{Where: "spec.batch.fromRun", Field: "verdict", Msg: fmt.Sprintf("is %q: only %q is supported", v, v1alpha1.FromRunFailed)}
		}
		p.Source = NewFromRunSource(p.Run.Namespace, b.FromRun.Name)
	default:
		q := NewQuerySource(b.Query)
		q.occurrence = spec.Occurrence
		p.Source = q
	}
	return p, nil
}

// objectAt is obj with v1alpha1.OccurrencePlaceholder in its key or prefix
// replaced by the run's occurrence (a schedule's run reads that day's
// export); a placeholder with no occurrence to give it is bad input.
func objectAt(obj v1alpha1.ObjectSource, occurrence string) (v1alpha1.ObjectSource, error) {
	for _, f := range []struct {
		name string
		v    *string
	}{{"key", &obj.Key}, {"prefix", &obj.Prefix}} {
		if !strings.Contains(*f.v, v1alpha1.OccurrencePlaceholder) {
			continue
		}
		if occurrence == "" {
			return obj, &InputError{Where: "spec.batch.object", Field: f.name, Msg: "names " + v1alpha1.OccurrencePlaceholder + " and the run has no spec.occurrence to replace it with"}
		}
		*f.v = strings.ReplaceAll(*f.v, v1alpha1.OccurrencePlaceholder, occurrence)
	}
	return obj, nil
}

// withOccurrence replaces v1alpha1.OccurrencePlaceholder in the items'
// occurrences by the run's spec.occurrence (nothing when it is unset), and
// reports whether it replaced any.
func withOccurrence(items []ledger.Item, occurrence string) bool {
	if occurrence == "" {
		return false
	}
	replaced := false
	for i := range items {
		if o := items[i].Occurrence; strings.Contains(o, v1alpha1.OccurrencePlaceholder) {
			items[i].Occurrence = strings.ReplaceAll(o, v1alpha1.OccurrencePlaceholder, occurrence)
			replaced = true
		}
	}
	return replaced
}

// UseProcessorURL points the run's processor at url (`runledger run
// --processor-url`: a processor the user started; the spec's image is not
// run). A run without spec.effect.processor is bad input.
func (p *Plan) UseProcessorURL(url string) error {
	if p.Processor == nil {
		return &InputError{Msg: "--processor-url is given but the run has no spec.effect.processor"}
	}
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		// Not echoed: a URL that does not parse may still hold a token.
		return &InputError{Msg: "--processor-url is not an http:// or https:// URL"}
	}
	p.Processor.URL = url
	return nil
}

// Check verifies on the database what can be verified before anything is
// committed: the run's uid is not another run's; the query parses, is
// read-only and returns the right columns; the effect parses against the
// database's tables. Problems are
// *InputError; retryable errors are retried with policy.
func (p *Plan) Check(ctx context.Context, store *ledger.Store, policy Backoff, onRetry func(attempt int, wait time.Duration, err error)) error {
	return policy.Do(ctx, "checking the batch and effect on the database", onRetry, func(int) error {
		if err := checkRunIdentity(ctx, store, p.Run); err != nil {
			return err
		}
		if q, ok := p.Source.(*QuerySource); ok {
			if err := q.Check(ctx, store); err != nil {
				return err
			}
			if err := q.checkEarlierRun(ctx, store, p.Run.UID); err != nil {
				return err
			}
		}
		if p.Effect != "" {
			return CheckEffect(ctx, store, p.Effect)
		}
		return nil
	})
}

// CheckEffect prepares the effect statement (without running it) next to a
// table claimed like the one the ledger gives it, so that a syntax error or
// a missing table is reported before the first commit, as bad input.
func CheckEffect(ctx context.Context, store *ledger.Store, effect string) error {
	if err := store.PrepareEffect(ctx, effect); err != nil {
		if errors.Is(err, ledger.ErrNoEffectSandbox) {
			return &InputError{Where: "spec.effect.sql", Msg: "cannot run: " + err.Error()}
		}
		return queryError("spec.effect.sql", err)
	}
	return nil
}
