// Package objectstore reads a batch's objects from an S3-compatible store
// (AWS S3, MinIO, SeaweedFS, Ceph RGW): it lists one object or every
// object under a prefix, in key order, and streams an object's bytes,
// resuming a read that broke off where it stopped (a ranged GET of the
// same ETag) rather than starting over. It tells errors that retrying
// cannot change (a missing bucket or object, a refused credential, a
// certificate that does not verify, a host that does not exist: Permanent)
// from those it can (a timeout, a 5xx, a connection refused).
//
// Credentials: the ones given, else the standard AWS chain (environment,
// shared files, web identity such as EKS's IRSA, ECS, the instance's role).
package objectstore

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Config says where the objects are and how to reach them.
type Config struct {
	// Endpoint is the store's URL (scheme and host); "": AWS's.
	Endpoint string
	Region   string
	Bucket   string
	// PathStyle puts the bucket in the URL's path, as most stores but AWS
	// need.
	PathStyle bool
	// CAPEM holds PEM certificates trusted besides the system's.
	CAPEM []byte
	// Credentials: nil takes the standard AWS chain.
	Credentials aws.CredentialsProvider
	// IdleTimeout ends a read that got no byte for that long; it resumes
	// where it stopped. 0: DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxObjects bounds a prefix's listing (0: no bound).
	MaxObjects int
}

// DefaultIdleTimeout is Config.IdleTimeout's default.
const DefaultIdleTimeout = time.Minute

// Bucket is a bucket of a store.
type Bucket struct {
	client *s3.Client
	cfg    Config
}

// Object is an object as the store lists it.
type Object struct {
	Key  string
	Size int64
	// ETag identifies its content (quotes included, as the store gives it).
	ETag string
}

// New returns the bucket cfg names. It sends no request.
func New(ctx context.Context, cfg Config) (*Bucket, error) {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	opts := []func(*config.LoadOptions) error{config.WithRegion(cfg.Region)}
	if len(cfg.CAPEM) > 0 && !x509.NewCertPool().AppendCertsFromPEM(cfg.CAPEM) {
		return nil, &PermanentError{Err: fmt.Errorf("the CA bundle of %s (object.caConfigMapRef) holds no PEM certificate", cfg.where(""))}
	}
	if len(cfg.CAPEM) > 0 {
		opts = append(opts, config.WithCustomCABundle(bytes.NewReader(cfg.CAPEM)))
	}
	if cfg.Credentials != nil {
		opts = append(opts, config.WithCredentialsProvider(cfg.Credentials))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, &PermanentError{Err: fmt.Errorf("configuring the client of %s: %w", cfg.where(""), err)}
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		// Checksums only when the operation requires them: stores other
		// than AWS do not all answer the newer ones.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	return &Bucket{client: client, cfg: cfg}, nil
}

// URL names key as s3://bucket/key.
func (b *Bucket) URL(key string) string { return b.cfg.where(key) }

func (c Config) where(key string) string { return "s3://" + c.Bucket + "/" + key }

// Stat returns the one object at key.
func (b *Bucket) Stat(ctx context.Context, key string) (Object, error) {
	out, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(b.cfg.Bucket), Key: aws.String(key)})
	if err != nil {
		return Object{}, classify(fmt.Sprintf("reading the metadata of %s", b.URL(key)), err)
	}
	return Object{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: aws.ToString(out.ETag)}, nil
}

// List returns every object whose key begins with prefix, in the byte
// order of their keys, folder markers (keys ending in "/") left out.
func (b *Bucket) List(ctx context.Context, prefix string) ([]Object, error) {
	var out []Object
	p := s3.NewListObjectsV2Paginator(b.client, &s3.ListObjectsV2Input{Bucket: aws.String(b.cfg.Bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, classify(fmt.Sprintf("listing %s", b.URL(prefix)), err)
		}
		for _, o := range page.Contents {
			key := aws.ToString(o.Key)
			if strings.HasSuffix(key, "/") {
				continue
			}
			out = append(out, Object{Key: key, Size: aws.ToInt64(o.Size), ETag: aws.ToString(o.ETag)})
			if b.cfg.MaxObjects > 0 && len(out) > b.cfg.MaxObjects {
				return nil, &PermanentError{Err: fmt.Errorf("%s holds more than %d objects, more than a batch may have: split it into runs of narrower prefixes", b.URL(prefix), b.cfg.MaxObjects)}
			}
		}
	}
	// S3 lists in UTF-8 binary order already; some stores do not promise it.
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Open streams o's bytes as of its ETag: a read that breaks off (an error,
// or no byte for IdleTimeout) goes on with a ranged GET from where it
// stopped, up to maxResumes times without progress; an object replaced
// meanwhile (another ETag) ends the read with an error wrapping ErrChanged.
// VersionID is the version read ("" where the store keeps none), known
// after the first Read.
func (b *Bucket) Open(ctx context.Context, o Object) *Reader {
	return &Reader{b: b, ctx: ctx, obj: o}
}

// ErrChanged: the object's content is not the one listed (replaced since).
var ErrChanged = errors.New("the object was replaced while it was read")

// maxResumes bounds a read's resumptions in a row without a byte read.
const maxResumes = 5

// Reader is an object's bytes (Bucket.Open).
type Reader struct {
	b   *Bucket
	ctx context.Context
	obj Object

	off       int64
	body      io.ReadCloser
	cancel    context.CancelFunc
	idle      *time.Timer
	failures  int
	versionID string
	got       bool // a GET answered
}

// VersionID is the version the reader reads ("" if the store keeps none).
func (r *Reader) VersionID() string { return r.versionID }

func (r *Reader) Read(p []byte) (int, error) {
	for {
		if r.body == nil {
			if r.off >= r.obj.Size && r.got {
				return 0, io.EOF
			}
			if err := r.get(); err != nil {
				return 0, err
			}
		}
		n, err := r.body.Read(p)
		r.off += int64(n)
		if n > 0 {
			r.failures = 0
			r.idle.Reset(r.b.cfg.IdleTimeout)
		}
		switch {
		case err == nil:
			return n, nil
		case errors.Is(err, io.EOF) && r.off >= r.obj.Size:
			r.closeBody()
			return n, io.EOF
		}
		// Cut short, or broken off: go on from r.off.
		r.closeBody()
		if n > 0 {
			return n, nil
		}
		if ctxErr := r.ctx.Err(); ctxErr != nil {
			return 0, fmt.Errorf("reading %s: %w", r.b.URL(r.obj.Key), ctxErr)
		}
		r.failures++
		if r.failures > maxResumes {
			return 0, &TransientError{Err: fmt.Errorf("reading %s at byte %d: %d reads in a row broke off: %w", r.b.URL(r.obj.Key), r.off, r.failures, err)}
		}
		select {
		case <-time.After(time.Duration(r.failures) * 200 * time.Millisecond):
		case <-r.ctx.Done():
			return 0, fmt.Errorf("reading %s: %w", r.b.URL(r.obj.Key), r.ctx.Err())
		}
	}
}

// get starts a GET of the object from r.off, of the listed ETag.
func (r *Reader) get() error {
	ctx, cancel := context.WithCancel(r.ctx)
	in := &s3.GetObjectInput{Bucket: aws.String(r.b.cfg.Bucket), Key: aws.String(r.obj.Key)}
	if r.obj.ETag != "" {
		in.IfMatch = aws.String(r.obj.ETag)
	}
	if r.off > 0 {
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", r.off))
	}
	out, err := r.b.client.GetObject(ctx, in)
	if err != nil {
		cancel()
		if isPreconditionFailed(err) {
			return &TransientError{Err: fmt.Errorf("reading %s: %w (its ETag is no longer %s)", r.b.URL(r.obj.Key), ErrChanged, r.obj.ETag)}
		}
		return classify(fmt.Sprintf("reading %s", r.b.URL(r.obj.Key)), err)
	}
	if r.obj.ETag != "" && out.ETag != nil && aws.ToString(out.ETag) != r.obj.ETag {
		cancel()
		_ = out.Body.Close()
		return &TransientError{Err: fmt.Errorf("reading %s: %w (ETag %s, listed as %s)", r.b.URL(r.obj.Key), ErrChanged, aws.ToString(out.ETag), r.obj.ETag)}
	}
	r.versionID, r.got = aws.ToString(out.VersionId), true
	r.body, r.cancel = out.Body, cancel
	r.idle = time.AfterFunc(r.b.cfg.IdleTimeout, cancel)
	return nil
}

func (r *Reader) closeBody() {
	if r.body == nil {
		return
	}
	r.idle.Stop()
	r.cancel()
	_ = r.body.Close()
	r.body = nil
}

// Close ends the read.
func (r *Reader) Close() error {
	r.closeBody()
	return nil
}
