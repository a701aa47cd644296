package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/batchfile"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/objectstore"
)

// ObjectSource is a batch held in objects of an S3-compatible store
// (spec.batch.object). Like a query's rows, the items are fixed in the
// ledger database once: the first shard of the run to start streams every
// object, checked line by line as strictly as a ConfigMap's, into
// runledger.batch (ledger.Store.FixObjectBatch), recording each object's
// key, size, ETag, version and the digest of the bytes read; every shard,
// attempt and resumption then reads its own rows from there, in key order,
// as a query batch's (queryStream). A shard that finds the batch fixed lists
// the objects again and refuses the run if one changed, was added or was
// removed since: the run's batch is what its first shard read, and a new
// file is a new run.
//
// A bad line or record, a missing bucket or object, a refused credential, a
// certificate that does not verify or a host that does not exist is bad
// input, with nothing written; a store that times out, answers 5xx or
// replaces an object while it is read makes the whole fix start over, with
// back-off (a read that merely broke off resumes where it stopped).
type ObjectSource struct {
	spec       v1alpha1.ObjectSource
	ca         []byte
	occurrence string
	// credentials: nil takes the standard AWS chain (the Secret's
	// environment variables in a pod).
	credentials aws.CredentialsProvider
	idle        time.Duration
}

// NewObjectSource returns the source of spec, trusting the PEM
// certificates ca besides the system's; occurrence is the run's
// spec.occurrence (v1alpha1.OccurrencePlaceholder in an item's occurrence
// becomes it).
func NewObjectSource(spec v1alpha1.ObjectSource, ca []byte, occurrence string) *ObjectSource {
	return &ObjectSource{spec: spec, ca: ca, occurrence: occurrence}
}

// UseCredentials makes the source sign with p instead of the AWS chain's.
func (o *ObjectSource) UseCredentials(p aws.CredentialsProvider) { o.credentials = p }

// UseIdleTimeout bounds how long a read may get no byte before it resumes
// (objectstore.DefaultIdleTimeout by default).
func (o *ObjectSource) UseIdleTimeout(d time.Duration) { o.idle = d }

func (o *ObjectSource) describe() string { return o.spec.Location() }

// digest identifies where and how the batch is read: the header records
// it, so that a worker reading another location or format under the same
// run (`runledger run` of an edited manifest) is refused.
func (o *ObjectSource) digest() string {
	b, _ := json.Marshal([]string{o.spec.Endpoint, o.spec.RegionOrDefault(), o.spec.Bucket, o.spec.Key, o.spec.Prefix,
		string(o.spec.Format), string(o.spec.CompressionOrDefault()), string(o.spec.CSVComma())})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (o *ObjectSource) bucket(ctx context.Context) (*objectstore.Bucket, error) {
	return objectstore.New(ctx, objectstore.Config{
		Endpoint: o.spec.Endpoint, Region: o.spec.RegionOrDefault(), Bucket: o.spec.Bucket, PathStyle: o.spec.UsesPathStyle(),
		CAPEM: o.ca, Credentials: o.credentials, IdleTimeout: o.idle, MaxObjects: v1alpha1.MaxBatchObjects,
	})
}

func (o *ObjectSource) open(ctx context.Context, store *ledger.Store, shard, shards int, opt streamOptions) (stream, error) {
	s := &queryStream{store: store, shard: shard, opt: opt, source: ledger.BatchSourceObject}
	if opt.fetchSize <= 0 {
		s.opt.fetchSize = v1alpha1.DefaultChunkSize
	}
	bucket, err := o.bucket(ctx)
	if err != nil {
		return nil, o.badInput(err)
	}
	onRetry := func(attempt int, wait time.Duration, err error) {
		opt.log.Info("fixing the batch failed, trying again", "retry", attempt, "wait", wait.Round(time.Millisecond), "error", err.Error())
		if opt.retried != nil {
			opt.retried(err)
		}
	}
	retryable := func(err error) bool { return ledger.IsRetryable(err) || objectstore.Transient(err) }
	start := time.Now()
	fixed := false
	err = s.opt.retry.DoWhile(ctx, "fixing the batch", retryable, onRetry, func(int) error {
		fixed = false // this attempt's: an earlier one's commit may have been lost
		h, err := store.FixObjectBatch(ctx, opt.run, ledger.ObjectBatch{Shards: shards, Digest: o.digest(), Timeout: opt.timeouts.Query, LockTimeout: opt.timeouts.Lock,
			Read: func(ctx context.Context, add func(ledger.Item) error) ([]ledger.BatchObject, error) {
				objects, err := o.read(ctx, bucket, opt, add)
				fixed = err == nil
				return objects, err
			}})
		if err != nil {
			return o.badInput(err)
		}
		if bad := batchMismatch(opt.run, h, ledger.BatchSourceObject, shards, o.digest()); bad != nil {
			return bad
		}
		if !fixed {
			if err := o.verify(ctx, bucket, store, opt.run.UID, h); err != nil {
				return o.badInput(err)
			}
		}
		s.batch = h
		s.rows, err = store.BatchShardSize(ctx, h, shard)
		return err
	})
	if err != nil {
		return nil, identityError(err)
	}
	opt.log.Info("batch fixed", "items", s.batch.Items, "shardItems", s.rows, "fixedAt", s.batch.Created.UTC().Format(time.RFC3339),
		"readNow", fixed, "elapsed", time.Since(start).Round(time.Millisecond).String())
	return s, nil
}

// badInput makes a refusal of the store that retrying cannot change bad
// input; every other error passes through.
func (o *ObjectSource) badInput(err error) error {
	if objectstore.Permanent(err) && !IsInputError(err) {
		return &InputError{Where: "spec.batch.object:", Msg: err.Error()}
	}
	return err
}

// list returns the batch's objects as the store lists them now.
func (o *ObjectSource) list(ctx context.Context, bucket *objectstore.Bucket) ([]objectstore.Object, error) {
	if o.spec.Key != "" {
		obj, err := bucket.Stat(ctx, o.spec.Key)
		if err != nil {
			return nil, err
		}
		return []objectstore.Object{obj}, nil
	}
	objects, err := bucket.List(ctx, o.spec.Prefix)
	if err == nil && len(objects) == 0 {
		err = &objectstore.PermanentError{Err: fmt.Errorf("%s holds no object (keys ending in / are skipped)", bucket.URL(o.spec.Prefix))}
	}
	return objects, err
}

// read streams every object of the batch to add, in order, and returns
// what it read.
func (o *ObjectSource) read(ctx context.Context, bucket *objectstore.Bucket, opt streamOptions, add func(ledger.Item) error) ([]ledger.BatchObject, error) {
	objects, err := o.list(ctx, bucket)
	if err != nil {
		return nil, err
	}
	// Batches of 1 MiB: they only spare calls; the COPY's window bounds what is held.
	fopt := batchfile.Options{Format: batchfile.JSONLines, Compression: compressionOf(o.spec.CompressionOrDefault()), Comma: o.spec.CSVComma(), Limits: opt.limits,
		BatchBytes: 1 << 20}
	if o.spec.Format == v1alpha1.ObjectCSV {
		fopt.Format = batchfile.CSV
	}
	out := make([]ledger.BatchObject, 0, len(objects))
	for _, obj := range objects {
		name := bucket.URL(obj.Key)
		r := bucket.Open(ctx, obj)
		var n int64
		stats, err := batchfile.Read(ctx, r, name, fopt, func(items []ledger.Item) error {
			if withOccurrence(items, o.occurrence) {
				first := n
				if err := ValidateItems(items, func(i int) string { return name + " item " + strconv.FormatInt(first+int64(i)+1, 10) }, opt.limits); err != nil {
					return err
				}
			}
			n += int64(len(items))
			for _, it := range items {
				if err := add(it); err != nil {
					return err
				}
			}
			return nil
		})
		_ = r.Close()
		if err != nil {
			return nil, err
		}
		if stats.Bytes != obj.Size {
			return nil, &objectstore.TransientError{Err: fmt.Errorf("reading %s: %d bytes read, %d listed: %w", name, stats.Bytes, obj.Size, objectstore.ErrChanged)}
		}
		opt.log.Info("object read", "object", name, "bytes", stats.Bytes, "items", n, "compression", stats.Compression.String())
		out = append(out, ledger.BatchObject{Key: obj.Key, Size: stats.Bytes, ETag: obj.ETag, VersionID: r.VersionID(), SHA256: stats.Digest()})
	}
	return out, nil
}

// verify lists the batch's objects again and compares them with those its
// first shard read (run's, whose header is h): any object changed, added or removed since is bad
// input, named.
func (o *ObjectSource) verify(ctx context.Context, bucket *objectstore.Bucket, store *ledger.Store, runUID string, h *ledger.BatchHeader) error {
	recorded, err := store.BatchObjects(ctx, runUID)
	if err != nil {
		return err
	}
	fixedAt := h.Created.UTC().Format(time.RFC3339)
	now, err := o.list(ctx, bucket)
	if err != nil {
		if objectstore.Permanent(err) && len(recorded) > 0 {
			return &InputError{Where: "spec.batch.object:", Msg: fmt.Sprintf("%s, read when the run's first shard fixed its batch at %s, cannot be read now (%v): the batch is fixed once; restore the object, or give the run a new name to process what the bucket holds now",
				bucket.URL(recorded[0].Key), fixedAt, err)}
		}
		return err
	}
	if msg := objectsChanged(recorded, now, bucket.URL); msg != "" {
		return &InputError{Where: "spec.batch.object:", Msg: msg + " since the run's first shard fixed its batch at " + fixedAt +
			": the batch is fixed once, from what it read then; restore the objects, or give the run a new name to process what the bucket holds now"}
	}
	return nil
}

// objectsChanged names the first difference between the objects a batch
// was read from and those listed now ("" if none).
func objectsChanged(recorded []ledger.BatchObject, now []objectstore.Object, url func(string) string) string {
	listed := make(map[string]objectstore.Object, len(now))
	for _, o := range now {
		listed[o.Key] = o
	}
	for _, r := range recorded {
		o, ok := listed[r.Key]
		switch {
		case !ok:
			return url(r.Key) + " was removed"
		case o.ETag != r.ETag || o.Size != r.Size:
			return fmt.Sprintf("%s was replaced (ETag %s, %d bytes; it was %s, %d bytes when read)", url(r.Key), o.ETag, o.Size, r.ETag, r.Size)
		}
		delete(listed, r.Key)
	}
	for _, o := range now {
		if _, added := listed[o.Key]; added {
			return url(o.Key) + " was added"
		}
	}
	return ""
}

func compressionOf(c v1alpha1.ObjectCompression) batchfile.Compression {
	switch c {
	case v1alpha1.ObjectNone:
		return batchfile.None
	case v1alpha1.ObjectGzip:
		return batchfile.Gzip
	case v1alpha1.ObjectZstd:
		return batchfile.Zstd
	}
	return batchfile.Detect
}
