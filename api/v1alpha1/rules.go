package v1alpha1

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The rules and defaults of a ProcessingRun's spec. The CRD's markers need
// literals, so each value below is also written in a marker of
// processingrun_types.go; rules_test.go checks that the generated CRD says
// the same. The worker and `runledger run` read them from here.
const (
	// MaxRunNameLength bounds metadata.name: it is the value of the LabelRun
	// label on the worker pods.
	MaxRunNameLength = 63

	// MaxKeyPartBytes bounds entity and occurrence, in bytes of UTF-8 (the
	// CRD checks size(bytes(self))): the ledger's unique index holds both
	// parts, and a B-tree entry must stay under PostgreSQL's ~2.7 kB.
	MaxKeyPartBytes = 1024
	// MaxInlineItems bounds spec.batch.items; larger batches use a
	// configMapRef or a query.
	MaxInlineItems = 10000
	// MaxSQLLength bounds spec.batch.query and spec.effect.sql, in characters.
	MaxSQLLength = 65536
	// MaxRefNameLength bounds the name and key of a Secret or ConfigMap
	// reference, in characters.
	MaxRefNameLength = 253
	// RefKeyPattern is what a Secret or ConfigMap key may contain.
	RefKeyPattern = `^[-._a-zA-Z0-9]+$`
	// MaxImageLength bounds spec.workerTemplate.image, in characters.
	MaxImageLength = 1024
	// MaxShardMessageLength bounds status.shards[].message, in characters
	// (a worker cuts its message to as many bytes, see Truncate).
	MaxShardMessageLength = 4096
	// MaxShardFailures bounds status.shards[].failures (and a report's).
	MaxShardFailures = 3
	// MaxFailureSampleBytes bounds each text of a FailureSample but its
	// class, in bytes (its class: MaxFailureClassBytes).
	MaxFailureSampleBytes = 256
	MaxFailureClassBytes  = 64

	// ReservedEnvPrefix starts the names of the environment variables
	// runledger sets on the worker container (EnvPodName is reserved too):
	// workerTemplate.env cannot hold them.
	ReservedEnvPrefix = "RUNLEDGER_"
	// ReservedMetadataPrefix starts the labels and annotations the
	// controller sets on worker pods: workerTemplate.metadata cannot hold them.
	ReservedMetadataPrefix = Group + "/"
	// WorkerTmpVolume is the name of the worker pods' emptyDir at
	// WorkerTmpPath; workerTemplate.volumes cannot use the name, nor
	// workerTemplate.volumeMounts the path (or TerminationMessagePath).
	WorkerTmpVolume = "tmp"
	// WorkerTmpPath is where WorkerTmpVolume is mounted.
	WorkerTmpPath = "/tmp"
	// ProcessorTmpVolume is the processor's emptyDir at WorkerTmpPath (its
	// root filesystem is read-only by default).
	ProcessorTmpVolume = "processor-tmp"
	// WorkerTokenVolume is the projected ServiceAccount token (pod-bound),
	// the cluster's CA and the namespace, mounted at WorkerTokenPath in the
	// worker container alone (and in the processor's when
	// spec.effect.processor.automountServiceAccountToken): the pod itself has
	// automountServiceAccountToken false.
	WorkerTokenVolume = "runledger-token"
	// WorkerTokenPath is where in-cluster clients look for the token.
	WorkerTokenPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// WorkerTokenExpirationSeconds is the projected token's lifetime; the
	// kubelet renews it at 80 % and client-go rereads the file.
	WorkerTokenExpirationSeconds = 3607
	// WorkerBatchVolume is spec.batch.configMapRef's key, mounted as the
	// file WorkerBatchPath/WorkerBatchFile in the worker container: the
	// worker reads no ConfigMap through the API.
	WorkerBatchVolume = "runledger-batch"
	// WorkerBatchPath is where WorkerBatchVolume is mounted.
	WorkerBatchPath = "/var/run/runledger/batch"
	// WorkerBatchFile is the batch's file name in WorkerBatchPath.
	WorkerBatchFile = "items.jsonl"
	// WorkerObjectCAVolume is spec.batch.object.caConfigMapRef's key,
	// mounted as the file WorkerObjectCAPath/WorkerObjectCAFile in the
	// worker container alone.
	WorkerObjectCAVolume = "runledger-object-ca"
	// WorkerObjectCAPath is where WorkerObjectCAVolume is mounted.
	WorkerObjectCAPath = "/var/run/runledger/object-ca"
	// WorkerObjectCAFile is the CA bundle's file name in WorkerObjectCAPath.
	WorkerObjectCAFile = "ca.crt"
	// MaxBatchObjects bounds the objects of a spec.batch.object prefix.
	MaxBatchObjects = 100000
	// DefaultObjectRegion is spec.batch.object.region when it is not set.
	DefaultObjectRegion = "us-east-1"
	// WorkerRunVolume is the run's ConfigMap (RunConfigMapName), mounted at
	// WorkerRunPath in the worker container: the worker reads its run from
	// the file, never through the API (its role cannot read runs).
	WorkerRunVolume = "runledger-run"
	// WorkerRunPath is where WorkerRunVolume is mounted.
	WorkerRunPath = "/var/run/runledger/run"
	// WorkerRunFile is the run's key in its ConfigMap and its file's name
	// in WorkerRunPath: the gzip of the run's JSON (EncodeRunFile), so that
	// a run as large as the API server stores fits a ConfigMap's 1 MiB.
	WorkerRunFile = "run.json.gz"
	// MaxWorkerEnv bounds workerTemplate.env (and the cost of its rule).
	MaxWorkerEnv = 64
	// MaxWorkerVolumes bounds workerTemplate.volumes and volumeMounts.
	MaxWorkerVolumes = 32
	// MaxWorkerMetadata bounds workerTemplate.metadata.labels and
	// annotations.
	MaxWorkerMetadata = 64

	// DefaultWorkers is spec.workers when it is not set.
	DefaultWorkers = 1
	// MaxWorkers bounds spec.workers (the number of shards).
	MaxWorkers = 256
	// ConnectionsPerWorker is the most connections to the ledger database
	// one worker process opens per shard it runs at once, each taken per
	// transaction (none holds a session): one for the statement in flight (a
	// chunk, fixing or sorting the batch, which may take minutes) and one
	// for renewing the shard's lease and publishing its progress meanwhile;
	// fixing a query's batch, before the lease is taken, uses both (the
	// query, the copy of its rows).
	// A worker pod runs one shard: a run's connection budget counts this
	// many per live pod.
	ConnectionsPerWorker = 2
	// MinMaxConnections bounds spec.database.maxConnections (and the
	// manager's default and maximum) from below: one worker pod's.
	MinMaxConnections = ConnectionsPerWorker
	// MaxMaxConnections bounds spec.database.maxConnections: PostgreSQL's
	// own bound on max_connections.
	MaxMaxConnections = 262143

	// DefaultChunkSize is spec.chunkSize when it is not set.
	DefaultChunkSize = 1000
	// MaxChunkSize bounds spec.chunkSize.
	MaxChunkSize = 50000
	// DefaultBackoffLimit is spec.backoffLimit when it is not set.
	DefaultBackoffLimit = 3
	// MaxBackoffLimit bounds spec.backoffLimit.
	MaxBackoffLimit = 100
	// DefaultNodeLostAfterSeconds is spec.nodeLostAfterSeconds when it is
	// not set: with the node controller's grace period (40-50 s) a lost
	// node's shards get a replacement within about two minutes.
	DefaultNodeLostAfterSeconds = 60
	// MaxNodeLostAfterSeconds bounds spec.nodeLostAfterSeconds.
	MaxNodeLostAfterSeconds = 3600
	// DefaultOnExisting is spec.onExisting when it is not set.
	DefaultOnExisting = OnExistingSkip
	// DefaultOnPayloadChange is spec.onPayloadChange when it is not set.
	DefaultOnPayloadChange = OnPayloadChangeReport
	// DefaultFromRunVerdict is spec.batch.fromRun.verdict when it is not set.
	DefaultFromRunVerdict = FromRunFailed

	// DefaultEffectSeconds, DefaultQuerySeconds, DefaultLockSeconds and
	// DefaultNetworkSeconds are spec.timeouts' defaults: an effect per chunk
	// and a query per run that take longer are stuck rather than slow, a
	// lock wait of a minute is a conflict, and a connection silent at the
	// network level for half a minute is lost.
	DefaultEffectSeconds  = 300
	DefaultQuerySeconds   = 3600
	DefaultLockSeconds    = 60
	DefaultNetworkSeconds = 30
	// MaxTimeoutSeconds bounds spec.timeouts' statement and lock timeouts
	// (a day); MinNetworkSeconds and MaxNetworkSeconds bound networkSeconds.
	MaxTimeoutSeconds = 86400
	MinNetworkSeconds = 2
	MaxNetworkSeconds = 3600

	// DefaultProcessorPort is spec.effect.processor.port when it is not set.
	DefaultProcessorPort = 8080
	// DefaultProcessorPath is spec.effect.processor.path when it is not set.
	DefaultProcessorPath = "/process"
	// DefaultProcessorTimeout is spec.effect.processor.timeout when it is
	// not set.
	DefaultProcessorTimeout = 30 * time.Second
	// MaxProcessorTimeout bounds spec.effect.processor.timeout: the chunk's
	// transaction stays open while the processor works.
	MaxProcessorTimeout = 10 * time.Minute
	// DefaultMaxItemsPerCall is spec.effect.processor.maxItemsPerCall when it
	// is not set.
	DefaultMaxItemsPerCall = 100
	// DefaultMaxCallsInFlight is spec.effect.processor.maxCallsInFlight
	// when it is not set; MaxCallsInFlight bounds it.
	DefaultMaxCallsInFlight = 2
	MaxCallsInFlight        = 64
)

// RunTimeouts are a spec's timeouts as durations, with the defaults filled
// in for a run built in Go rather than decoded through the CRD's defaults.
type RunTimeouts struct {
	Effect, Query, Lock, Network time.Duration
}

// The spec's defaults, applied in one place: the CRD fills them in for a run
// decoded through the API server, these methods for one built in Go.

// ShardCount is spec.workers, or DefaultWorkers when unset.
func (s *ProcessingRunSpec) ShardCount() int32 { return cmp.Or(s.Workers, DefaultWorkers) }

// ChunkSizeOrDefault is spec.chunkSize, or DefaultChunkSize when unset.
func (s *ProcessingRunSpec) ChunkSizeOrDefault() int32 { return cmp.Or(s.ChunkSize, DefaultChunkSize) }

// BackoffLimitOrDefault is spec.backoffLimit, or DefaultBackoffLimit when
// unset.
func (s *ProcessingRunSpec) BackoffLimitOrDefault() int32 {
	if s.BackoffLimit != nil {
		return *s.BackoffLimit
	}
	return DefaultBackoffLimit
}

// PayloadChangePolicy is spec.onPayloadChange, or DefaultOnPayloadChange
// when unset.
func (s *ProcessingRunSpec) PayloadChangePolicy() OnPayloadChangePolicy {
	return cmp.Or(s.OnPayloadChange, DefaultOnPayloadChange)
}

// VerdictOrDefault is fromRun.verdict, or DefaultFromRunVerdict when unset.
func (f *FromRunSource) VerdictOrDefault() FromRunVerdict {
	return cmp.Or(f.Verdict, DefaultFromRunVerdict)
}

// NodeLostAfter is spec.nodeLostAfterSeconds, or
// DefaultNodeLostAfterSeconds when unset.
func (s *ProcessingRunSpec) NodeLostAfter() time.Duration {
	secs := int32(DefaultNodeLostAfterSeconds)
	if s.NodeLostAfterSeconds != nil {
		secs = *s.NodeLostAfterSeconds
	}
	return time.Duration(secs) * time.Second
}

// ConnectionBudgetSettings are the manager's settings of every run's
// connection budget (--run-max-connections-default and
// --run-max-connections-maximum; the chart's runMaxConnections.default and
// .maximum); 0 is none.
type ConnectionBudgetSettings struct {
	// Default is the budget of a run that sets no
	// spec.database.maxConnections.
	Default int32
	// Maximum caps every run's budget, whatever it sets.
	Maximum int32
}

// Validate says what is wrong with the settings: each is 0 or within
// MinMaxConnections..MaxMaxConnections, and a default above the maximum
// would never apply.
func (m ConnectionBudgetSettings) Validate() error {
	for _, v := range []struct {
		flag  string
		value int32
	}{{"--run-max-connections-default", m.Default}, {"--run-max-connections-maximum", m.Maximum}} {
		if v.value != 0 && (v.value < MinMaxConnections || v.value > MaxMaxConnections) {
			return fmt.Errorf("%s %d: want 0 (none) or %d to %d connections (a worker pod holds %d)",
				v.flag, v.value, MinMaxConnections, MaxMaxConnections, ConnectionsPerWorker)
		}
	}
	if m.Default != 0 && m.Maximum != 0 && m.Default > m.Maximum {
		return fmt.Errorf("--run-max-connections-default %d is above --run-max-connections-maximum %d", m.Default, m.Maximum)
	}
	return nil
}

// ConnectionBudget is a run's connection budget in force; the zero value is
// no budget.
type ConnectionBudget struct {
	// Limit is the most connections the run's workers may hold at once, 0
	// for no budget.
	Limit  int32
	Source ConnectionBudgetSource
}

// ConnectionBudgetOf is the budget of a run with spec under the manager's
// settings m: spec.database.maxConnections, or m.Default when it is unset;
// m.Maximum caps either, and applies alone when neither is set.
func ConnectionBudgetOf(spec *ProcessingRunSpec, m ConnectionBudgetSettings) ConnectionBudget {
	b := ConnectionBudget{}
	switch {
	case spec.Database.MaxConnections != nil:
		b = ConnectionBudget{Limit: *spec.Database.MaxConnections, Source: BudgetFromRun}
	case m.Default > 0:
		b = ConnectionBudget{Limit: m.Default, Source: BudgetFromManagerDefault}
	}
	if m.Maximum > 0 && (b.Limit == 0 || b.Limit > m.Maximum) {
		b = ConnectionBudget{Limit: m.Maximum, Source: BudgetFromManagerMaximum}
	}
	return b
}

// Parallelism is the most of shards that run at once within the budget
// (worker pods, or `runledger run`'s shards in one process): all of them
// without a budget, else Limit / ConnectionsPerWorker, at least 1.
func (b ConnectionBudget) Parallelism(shards int32) int32 {
	if b.Limit <= 0 {
		return shards
	}
	return min(shards, max(b.Limit/ConnectionsPerWorker, 1))
}

// MaxConnectionsOf is the most connections a worker process opens for
// parallel shards running at once (the README's formula):
// ConnectionsPerWorker per shard, each taken and given back per
// transaction (docs/poolers.md). Before its
// shards start, the process uses at most two (migrations, the plan's
// check). A worker pod runs one shard: 2; `runledger run --parallel P`: 2P.
func MaxConnectionsOf(parallel int32) int32 { return ConnectionsPerWorker * max(parallel, 1) }

// TimeoutsOf returns spec's timeouts, defaults included.
func TimeoutsOf(spec *ProcessingRunSpec) RunTimeouts {
	var t Timeouts
	if spec.Timeouts != nil {
		t = *spec.Timeouts
	}
	secs := func(v, def int32) time.Duration {
		if v <= 0 {
			v = def
		}
		return time.Duration(v) * time.Second
	}
	return RunTimeouts{
		Effect:  secs(t.EffectSeconds, DefaultEffectSeconds),
		Query:   secs(t.QuerySeconds, DefaultQuerySeconds),
		Lock:    secs(t.LockSeconds, DefaultLockSeconds),
		Network: secs(t.NetworkSeconds, DefaultNetworkSeconds),
	}
}

// URL is where a worker calls the processor: its own pod's loopback, the
// processor's port and path (defaults applied).
func (p *ProcessorSpec) URL() string {
	port, path := p.Port, p.Path
	if port == 0 {
		port = DefaultProcessorPort
	}
	if path == "" {
		path = DefaultProcessorPath
	}
	return "http://127.0.0.1:" + strconv.Itoa(int(port)) + path
}

// CallTimeout is the timeout of one call (default applied).
func (p *ProcessorSpec) CallTimeout() time.Duration {
	if p.Timeout == nil || p.Timeout.Duration <= 0 {
		return DefaultProcessorTimeout
	}
	return p.Timeout.Duration
}

// ItemsPerCall is the most items one call carries (default applied).
func (p *ProcessorSpec) ItemsPerCall() int {
	if p.MaxItemsPerCall <= 0 {
		return DefaultMaxItemsPerCall
	}
	return int(p.MaxItemsPerCall)
}

// CallsInFlight is the most calls of a chunk in flight at once (default
// applied).
func (p *ProcessorSpec) CallsInFlight() int {
	if p.MaxCallsInFlight <= 0 {
		return DefaultMaxCallsInFlight
	}
	return int(p.MaxCallsInFlight)
}

// MountsToken reports whether the processor container gets the worker's
// ServiceAccount token (default: no).
func (p *ProcessorSpec) MountsToken() bool {
	return p.AutomountServiceAccountToken != nil && *p.AutomountServiceAccountToken
}

// ReadOnlyRoot reports whether the processor's root filesystem is
// read-only (default: yes).
func (p *ProcessorSpec) ReadOnlyRoot() bool {
	return p.ReadOnlyRootFilesystem == nil || *p.ReadOnlyRootFilesystem
}

// ListenPort is the processor's port (default applied).
func (p *ProcessorSpec) ListenPort() int32 {
	if p.Port == 0 {
		return DefaultProcessorPort
	}
	return p.Port
}

// KeyPartProblem says what is wrong with one part of a business key (an
// entity, an occurrence), as the CRD's rules on them do, or "" when nothing
// is: the worker's check of a batch's items and the checks of an
// occurrence given by hand (`runledger schedule trigger`, the trigger
// annotation) are this one.
func KeyPartProblem(v string) string {
	switch {
	case v == "":
		return "is empty"
	case strings.TrimSpace(v) == "":
		return "is blank (only white space)"
	case len(v) > MaxKeyPartBytes:
		return fmt.Sprintf("is %d bytes long, more than the %d allowed", len(v), MaxKeyPartBytes)
	case !utf8.ValidString(v):
		return "is not valid UTF-8"
	case strings.IndexByte(v, 0) >= 0:
		return "contains a NUL character, which PostgreSQL text cannot hold"
	}
	return ""
}

// ObjectCredentialKeys are the keys of spec.batch.object.credentialsSecretRef
// given to the worker container as environment variables of the same
// names, the standard AWS credential chain's; the last one is optional.
var ObjectCredentialKeys = []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}

// RegionOrDefault is region, or DefaultObjectRegion when unset.
func (o *ObjectSource) RegionOrDefault() string { return cmp.Or(o.Region, DefaultObjectRegion) }

// UsesPathStyle is pathStyle, or whether endpoint is set when unset.
func (o *ObjectSource) UsesPathStyle() bool {
	if o.PathStyle != nil {
		return *o.PathStyle
	}
	return o.Endpoint != ""
}

// CompressionOrDefault is compression, or Auto when unset.
func (o *ObjectSource) CompressionOrDefault() ObjectCompression {
	return cmp.Or(o.Compression, ObjectAuto)
}

// CSVComma is csvDelimiter as a rune (a tab is written "\t" in YAML):
// ',' when unset.
func (o *ObjectSource) CSVComma() rune {
	if o.CSVDelimiter == "" {
		return ','
	}
	return []rune(o.CSVDelimiter)[0]
}

// Location is the object's or prefix's s3:// URL, for messages.
func (o *ObjectSource) Location() string {
	if o.Key != "" {
		return "s3://" + o.Bucket + "/" + o.Key
	}
	return "s3://" + o.Bucket + "/" + o.Prefix
}
