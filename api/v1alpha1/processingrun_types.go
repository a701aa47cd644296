package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProcessingRun declares one batch of business items whose effects must
// happen exactly once. The controller splits it into `workers` shards and
// runs one worker pod per shard; every item is committed through the ledger,
// whose unique rule (not any check) decides what was already handled.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=prun,categories=runledger
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Completed",type=integer,JSONPath=`.status.completed`
// +kubebuilder:printcolumn:name="Already-Handled",type=integer,JSONPath=`.status.alreadyHandled`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.failed`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.total`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.active`,description="The run's live worker pods (each holds at most 2 connections to the ledger database)"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Stalled")].reason`,description="Why the run is stuck or failed (the Stalled condition's reason)"
// +kubebuilder:printcolumn:name="Admission",type=string,JSONPath=`.status.conditions[?(@.type=="Admitted")].reason`,description="For a run in a Kueue queue: Queued, Admitted or Evicted (the Admitted condition's reason)"
// +kubebuilder:printcolumn:name="ClusterQueue",type=string,JSONPath=`.status.queue.clusterQueue`,priority=1,description="The Kueue ClusterQueue that admitted the run"
// +kubebuilder:printcolumn:name="Duration",type=string,JSONPath=`.status.duration`,description="How long the finished run took, from its first pod to its outcome"
// +kubebuilder:printcolumn:name="Workers",type=integer,JSONPath=`.spec.workers`,priority=1
// +kubebuilder:printcolumn:name="Max-Connections",type=integer,JSONPath=`.status.connections.limit`,priority=1,description="The run's connection budget in force (spec.database.maxConnections or the manager's default, within the manager's maximum)"
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.connections.waiting`,priority=1,description="Shards that wait for the connection budget"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: it is used as a label value on the worker pods"
// +kubebuilder:validation:XValidation:rule="self.spec.database.secretRef == oldSelf.spec.database.secretRef",message="database.secretRef is immutable: a run's ledger cannot change, create a new ProcessingRun instead (database.maxConnections may change)",fieldPath=`.spec.database.secretRef`
// +kubebuilder:validation:XValidation:rule="self.spec.batch == oldSelf.spec.batch",message="batch is immutable: create a new ProcessingRun to process a different batch",fieldPath=`.spec.batch`
// +kubebuilder:validation:XValidation:rule="!has(self.spec.batch.fromRun) || self.spec.batch.fromRun.name != self.metadata.name",message="batch.fromRun names this run itself: a retry is another run",fieldPath=`.spec.batch.fromRun.name`
// +kubebuilder:validation:XValidation:rule="has(self.spec.effect) == has(oldSelf.spec.effect)",message="effect cannot be added or removed after creation: create a new ProcessingRun instead",fieldPath=`.spec.effect`
// +kubebuilder:validation:XValidation:rule="!has(self.spec.effect) || !has(oldSelf.spec.effect) || self.spec.effect == oldSelf.spec.effect",message="effect is immutable: create a new ProcessingRun to apply a different effect",fieldPath=`.spec.effect`
// +kubebuilder:validation:XValidation:rule="(has(self.spec.onExisting) ? self.spec.onExisting : 'Skip') == (has(oldSelf.spec.onExisting) ? oldSelf.spec.onExisting : 'Skip')",message="onExisting is immutable: create a new ProcessingRun to change it",fieldPath=`.spec.onExisting`
// +kubebuilder:validation:XValidation:rule="(has(self.spec.onPayloadChange) ? self.spec.onPayloadChange : 'Report') == (has(oldSelf.spec.onPayloadChange) ? oldSelf.spec.onPayloadChange : 'Report')",message="onPayloadChange is immutable: create a new ProcessingRun to change it",fieldPath=`.spec.onPayloadChange`
// +kubebuilder:validation:XValidation:rule="(has(self.spec.workers) ? self.spec.workers : 1) == (has(oldSelf.spec.workers) ? oldSelf.spec.workers : 1)",message="workers is immutable: the number of shards decides which shard owns each item, create a new ProcessingRun to change it",fieldPath=`.spec.workers`
// +kubebuilder:validation:XValidation:rule=`has(self.spec.managedBy) == has(oldSelf.spec.managedBy) && (!has(self.spec.managedBy) || self.spec.managedBy == oldSelf.spec.managedBy)`,message="managedBy is immutable: the controller that runs a ProcessingRun is chosen at its creation",fieldPath=`.spec.managedBy`
// +kubebuilder:validation:XValidation:rule=`has(self.spec.occurrence) == has(oldSelf.spec.occurrence) && (!has(self.spec.occurrence) || self.spec.occurrence == oldSelf.spec.occurrence)`,message="occurrence is immutable: create a new ProcessingRun for another occurrence",fieldPath=`.spec.occurrence`
type ProcessingRun struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec declares the batch, where its ledger lives and how to run it.
	// +required
	Spec ProcessingRunSpec `json:"spec"`

	// status is written by the controller alone; workers report on their
	// own pods (while a run runs, one of its workers reports every shard's
	// progress, at most every 4 s) and the controller copies their reports
	// into shards[]. Until
	// the controller first writes it, it reads {observedGeneration: 0}: behind metadata.generation,
	// so kstatus (Flux, cli-utils) and Argo CD
	// read a new run as in progress, never as done.
	// +optional
	// +kubebuilder:default={observedGeneration: 0}
	Status ProcessingRunStatus `json:"status,omitempty"`
}

// ProcessingRunList is a list of ProcessingRuns.
//
// +kubebuilder:object:root=true
type ProcessingRunList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProcessingRun `json:"items"`
}

// ProcessingRunSpec is the desired state of a ProcessingRun. Everything that
// defines the batch and its effect (the database's secretRef, batch, effect,
// onExisting, workers, occurrence) is immutable: to process something else,
// create another run. (The rules sit on ProcessingRun itself, not here, because a
// ProcessingSchedule's runTemplate embeds this type and stays editable.)
type ProcessingRunSpec struct {
	// database says where the ledger is: a Secret key holding the PostgreSQL
	// connection string (immutable; the DSN is never part of the spec), and
	// how many connections to it the run may hold at once (maxConnections).
	// +required
	Database DatabaseSpec `json:"database"`

	// batch is the set of items to process: exactly one of items,
	// configMapRef, query or fromRun.
	// +required
	Batch BatchSpec `json:"batch"`

	// effect is what processing an item does, in the same transaction that
	// claims it in the ledger. Without an effect the run only records items.
	// +optional
	Effect *EffectSpec `json:"effect,omitempty"`

	// onExisting says what to do with an item whose business key is already
	// committed in the ledger: Skip it (count it as already handled), or
	// Supersede the committed row (deliberate reprocessing).
	// +optional
	// +kubebuilder:default=Skip
	OnExisting OnExistingPolicy `json:"onExisting,omitempty"`

	// onPayloadChange says what to do with an item that is already handled
	// (another run's committed row holds its key, onExisting: Skip) but whose
	// payload differs from that row's: Report counts it in
	// status.payloadChanged and as already handled; Fail counts it there and
	// as failed instead (nothing is written either way). Payloads are
	// compared as PostgreSQL compares jsonb values: key order, white space
	// and the spelling of a number (1.0, 1, 1e0) do not matter; no payload
	// and a JSON null are the same, and differ from any other value. Every
	// copy of a key within the batch is compared: the key's payload changed
	// if any copy's differs, whichever comes first (counted once; with
	// Fail, every copy fails).
	// +optional
	// +kubebuilder:default=Report
	OnPayloadChange OnPayloadChangePolicy `json:"onPayloadChange,omitempty"`

	// workers is the number of shards, one worker pod each. Every item
	// belongs to exactly one shard (a stable hash of its business key).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=256
	Workers int32 `json:"workers,omitempty"`

	// occurrence is the occurrence of a recurring batch this run processes
	// (a ProcessingSchedule sets it from the tick's scheduled time; set it
	// yourself to run a template by hand). The batch reads it: in every
	// item's occurrence, inline or from a configMapRef, each
	// "$(OCCURRENCE)" is replaced by it (the result must still be a valid
	// occurrence); a batch.query reads it as
	// current_setting('runledger.occurrence'), a setting of the transaction
	// that runs the query (never text pasted into the SQL). Unset: nothing
	// is replaced and the setting does not exist.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 1024",message="must be at most 1024 bytes of UTF-8: it becomes the occurrence of items"
	// +kubebuilder:validation:XValidation:rule="self.trim() != ''",message="must not be only white space"
	// +kubebuilder:validation:XValidation:rule=`!self.contains('\u0000')`,message="must not contain a NUL character, which PostgreSQL text cannot hold"
	Occurrence string `json:"occurrence,omitempty"`

	// chunkSize is the number of items a worker commits per transaction.
	// +optional
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=50000
	ChunkSize int32 `json:"chunkSize,omitempty"`

	// backoffLimit is the number of retries per shard: a failed shard pod is
	// replaced (attempt+1) after an exponential back-off until a shard has
	// failed backoffLimit+1 times; then the run is Failed.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	BackoffLimit *int32 `json:"backoffLimit,omitempty"`

	// maxFailedItems is the number of items allowed to fail (e.g. the effect
	// violates a foreign key) before the run is Failed. Each worker stops its
	// shard when the shard alone exceeds it; the controller fails the run
	// when all shards together exceed it.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	MaxFailedItems int64 `json:"maxFailedItems,omitempty"`

	// nodeLostAfterSeconds is how long a shard's pod may sit on a node that
	// is NotReady or unreachable before the shard gets a replacement pod,
	// without waiting for the old pod to be confirmed gone (a lost node
	// never confirms it). A pod being deleted on such a node is replaced at
	// once. The old pod may still run (a partition): the shard's lock makes
	// the replacement wait for it, and the ledger commits each item once.
	// Worker pods also tolerate the not-ready and unreachable taints for
	// this long (instead of the cluster's 300 s).
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	NodeLostAfterSeconds *int32 `json:"nodeLostAfterSeconds,omitempty"`

	// suspend stops the run's pods (they finish their current chunk and
	// report) and keeps its counts; setting it back to false resumes it.
	// A run in a Kueue queue (the label kueue.x-k8s.io/queue-name) is also
	// held suspended, whatever this field says, until Kueue admits its
	// Workload, and again while Kueue evicts it; suspending it deactivates
	// its Workload (spec.active), which gives its quota back.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// managedBy is the controller that runs this ProcessingRun, as
	// batch/v1 Job's field. Unset or processing.runledger.dev/controller:
	// runledger's manager. Any other value (MultiKueue's
	// kueue.x-k8s.io/multikueue on a manager cluster, which dispatches the
	// run to a worker cluster and copies its status back) makes runledger's
	// manager create no pod and write no status for the run; it still
	// keeps the run's Kueue Workload, which MultiKueue needs. Immutable.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	ManagedBy *string `json:"managedBy,omitempty"`

	// ttlSecondsAfterFinished deletes the run (and its pods, never its ledger
	// rows) this many seconds after it Succeeded or Failed.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`

	// activeDeadlineSeconds fails the run (reason DeadlineExceeded) and stops
	// its pods once this many seconds have passed since its first pod was
	// created (status.startTime), as a Job's does. A suspended run is not
	// failed by it while suspended. Unset: no deadline.
	// +optional
	// +kubebuilder:validation:Minimum=1
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`

	// timeouts bound the run's SQL and notice a lost connection. Each has a
	// default; changes apply to pods created afterwards.
	// +optional
	// +kubebuilder:default={}
	Timeouts *Timeouts `json:"timeouts,omitempty"`

	// workerTemplate customises the worker pods. Changes apply to pods created
	// afterwards.
	// +optional
	WorkerTemplate *WorkerTemplate `json:"workerTemplate,omitempty"`
}

// DatabaseSpec locates the ledger's database.
type DatabaseSpec struct {
	// secretRef is the key of a Secret, in the run's namespace, whose value is
	// the PostgreSQL connection string (a URL or key=value DSN). Worker pods
	// get it as the environment variable RUNLEDGER_DATABASE_URL.
	// +required
	SecretRef SecretKeyRef `json:"secretRef"`

	// maxConnections is the run's connection budget: the most connections
	// to the ledger database its worker pods may hold at once. A worker pod
	// opens at most 2, so the controller runs at most maxConnections / 2
	// pods at once (never more than workers): the other shards wait,
	// Pending, not failed, and start as running ones finish, the lowest
	// shard first; a retried shard's new attempt waits like any other.
	// status.connections shows the budget in force and how many shards
	// wait, and while any does the Reconciling condition's reason is
	// WaitingForConnectionBudget (unless one that needs attention, such as
	// Unschedulable or DatabaseRefusingConnections, applies). Unset: the manager's
	// default (--run-max-connections-default), or no budget when it has
	// none; the manager's maximum (--run-max-connections-maximum) caps it
	// either way. It may change while the run runs: a higher budget starts
	// waiting shards, a lower one stops the pods above it (those not yet
	// running first, then the highest shards; each finishes its chunk, and
	// its shard resumes later from the ledger, as after a suspend). A
	// queued run (Kueue) asks quota for the pods its budget allows and
	// never runs more pods than Kueue admitted. runledger run reads it too:
	// --parallel at most maxConnections / 2.
	// +optional
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=262143
	MaxConnections *int32 `json:"maxConnections,omitempty"`
}

// SecretKeyRef selects a key of a Secret in the run's namespace.
type SecretKeyRef struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// key in the Secret's data.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// ConfigMapKeyRef selects a key of a ConfigMap in the run's namespace.
type ConfigMapKeyRef struct {
	// name of the ConfigMap.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// key in the ConfigMap's data.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// BatchSpec is the source of a run's items: exactly one of items,
// configMapRef, query, fromRun or object.
//
// +kubebuilder:validation:XValidation:rule="has(self.items) || has(self.configMapRef) || has(self.query) || has(self.fromRun) || has(self.object)",message="batch has no source: set exactly one of batch.items, batch.configMapRef, batch.query, batch.fromRun or batch.object"
// +kubebuilder:validation:XValidation:rule="(has(self.items) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) + (has(self.query) ? 1 : 0) + (has(self.fromRun) ? 1 : 0) + (has(self.object) ? 1 : 0) <= 1",message="batch has more than one source: keep exactly one of batch.items, batch.configMapRef, batch.query, batch.fromRun or batch.object"
type BatchSpec struct {
	// items is the batch inline, for small batches.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=10000
	Items []Item `json:"items,omitempty"`

	// configMapRef is a ConfigMap key holding the batch as JSON Lines: one
	// object {"entity": ..., "occurrence": ..., "payload": ...} per line.
	// +optional
	ConfigMapRef *ConfigMapKeyRef `json:"configMapRef,omitempty"`

	// query is an SQL SELECT, run against the run's database in a read-only
	// transaction, returning the text columns entity and occurrence and
	// optionally a jsonb column payload.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=65536
	// +kubebuilder:validation:XValidation:rule="self.replace(';', '').trim() != ''",message="must hold a statement, not only white space and semicolons"
	Query string `json:"query,omitempty"`

	// fromRun is the items of an earlier run of the same namespace that
	// have the given verdict there, read from the ledger's failure records
	// (runledger.item_failure) with their payloads: {name: june, verdict:
	// Failed} retries exactly the items that failed in run june. Like a
	// query's rows, they are fixed in the ledger once, when the first shard
	// of this run starts: failures recorded later (june still running, or
	// run again) are not in it. The earlier run is the latest run of that
	// name whose batch the ledger holds; a name that matches none, or one
	// pruned since, fails the run as bad input. A failure of a row that was
	// no item (bad input), or whose payload was not kept (not UTF-8 text, or
	// over 1 MiB), fails again.
	// +optional
	FromRun *FromRunSource `json:"fromRun,omitempty"`

	// object is one object, or every object under a prefix, of an
	// S3-compatible store (AWS S3, MinIO, SeaweedFS, Ceph RGW...), in JSON
	// Lines or CSV, plain or gzip- or zstd-compressed. Like a query's rows,
	// the items are fixed in the ledger database once, when the first shard
	// of the run starts: it streams the objects into runledger.batch (in
	// bounded memory, whatever their size) and records each object's key,
	// size, ETag, version and the SHA-256 of the bytes it read. Every other
	// shard, retried pod or resumption reads the fixed batch, never the
	// objects' contents again; it lists the objects once more and refuses
	// the run as bad input if one changed, was added or was removed since
	// (process the new files in a run of a new name). A bad line or record
	// (invalid UTF-8, a field twice, a key part missing or too long, a CSV
	// row with the wrong number of fields, an unterminated quote), a missing
	// bucket or object, a refused credential or a wrong endpoint fails the
	// run as bad input, naming the object and line, with nothing committed;
	// a store that times out or answers 5xx is retried with back-off.
	// +optional
	Object *ObjectSource `json:"object,omitempty"`
}

// ObjectSource is a batch held in objects of an S3-compatible store.
//
// +kubebuilder:validation:XValidation:rule="has(self.key) != has(self.prefix)",message="set exactly one of object.key (one object) or object.prefix (every object under it)"
// +kubebuilder:validation:XValidation:rule="!has(self.csvDelimiter) || self.format == 'CSV'",message="csvDelimiter applies to format CSV only"
type ObjectSource struct {
	// endpoint is the URL of the store's S3 API, scheme and host only
	// (https://minio.storage.svc:9000). Unset: AWS S3's endpoint of the
	// region. https is verified against the system's CAs and caConfigMapRef's;
	// http:// sends the credentials' signatures and the data unencrypted.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^/?#@\s]+/?$`
	Endpoint string `json:"endpoint,omitempty"`
	// region the requests are signed for; default us-east-1. Most stores
	// other than AWS accept any region.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-z0-9][-a-z0-9]*$`
	Region string `json:"region,omitempty"`
	// bucket holding the objects.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9][-._a-zA-Z0-9]*$`
	Bucket string `json:"bucket"`
	// key of the one object that holds the batch. $(OCCURRENCE) in it is
	// replaced by spec.occurrence (a schedule's run reads that day's file).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Key string `json:"key,omitempty"`
	// prefix: the batch is every object whose key begins with it (a
	// "folder" such as exports/2026-06-30/), read in the byte order of their
	// keys, as the store lists them. Keys ending in "/" (folder markers) are
	// skipped; a prefix with no object is bad input. At most 100000 objects.
	// $(OCCURRENCE) in it is replaced by spec.occurrence
	// (exports/$(OCCURRENCE)/ in a schedule's template).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Prefix string `json:"prefix,omitempty"`
	// format of every object: JSONLines (one JSON object {"entity": ...,
	// "occurrence": ..., "payload": ...} per line, as a configMapRef batch)
	// or CSV (RFC 4180, a header row naming an entity and an occurrence
	// column; every other column is the payload's, as a JSON string:
	// {"amount": "12.5"}).
	// +required
	Format ObjectFormat `json:"format"`
	// csvDelimiter is the CSV field delimiter: ",", ";", a tab ("\t" in
	// YAML) or "|"; default ",".
	// +optional
	// +kubebuilder:validation:Enum=",";";";"\t";"|"
	CSVDelimiter string `json:"csvDelimiter,omitempty"`
	// compression of every object: Auto (the default) tells gzip and zstd
	// from plain text by the object's first bytes (never by its name);
	// None, Gzip or Zstd requires it.
	// +optional
	// +kubebuilder:default=Auto
	Compression ObjectCompression `json:"compression,omitempty"`
	// pathStyle addresses the bucket in the URL's path
	// (https://host/bucket/key), as most stores other than AWS need;
	// default: true when endpoint is set, false for AWS.
	// +optional
	PathStyle *bool `json:"pathStyle,omitempty"`
	// credentialsSecretRef names a Secret of the run's namespace with the
	// keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and optionally
	// AWS_SESSION_TOKEN), given to the worker container alone as
	// environment variables: never to the processor. Unset: the standard
	// AWS credential chain of the worker's pod (the cluster's workload
	// identity, such as EKS's IRSA or Pod Identity, or the node's role).
	// +optional
	CredentialsSecretRef *LocalSecretRef `json:"credentialsSecretRef,omitempty"`
	// caConfigMapRef is a ConfigMap key holding PEM CA certificates that
	// the endpoint's certificate may chain to, besides the system's.
	// +optional
	CAConfigMapRef *ConfigMapKeyRef `json:"caConfigMapRef,omitempty"`
}

// LocalSecretRef names a Secret in the run's namespace.
type LocalSecretRef struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// ObjectFormat is how an object writes its items.
// +kubebuilder:validation:Enum=JSONLines;CSV
type ObjectFormat string

// Object formats.
const (
	ObjectJSONLines ObjectFormat = "JSONLines"
	ObjectCSV       ObjectFormat = "CSV"
)

// ObjectCompression is how an object's bytes are compressed.
// +kubebuilder:validation:Enum=Auto;None;Gzip;Zstd
type ObjectCompression string

// Object compressions.
const (
	ObjectAuto ObjectCompression = "Auto"
	ObjectNone ObjectCompression = "None"
	ObjectGzip ObjectCompression = "Gzip"
	ObjectZstd ObjectCompression = "Zstd"
)

// FromRunSource names an earlier run and which of its items to take.
type FromRunSource struct {
	// name of the earlier run (metadata.name), in this run's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// verdict of the items to take: Failed, the items whose current
	// verdict in that run is failed (a later attempt or rerun of it that
	// completed an item took it off).
	// +optional
	// +kubebuilder:default=Failed
	Verdict FromRunVerdict `json:"verdict,omitempty"`
}

// FromRunVerdict is which items of an earlier run a fromRun batch takes.
// +kubebuilder:validation:Enum=Failed
type FromRunVerdict string

// FromRunFailed takes the items that failed.
const FromRunFailed FromRunVerdict = "Failed"

// Item is one business occurrence. (entity, occurrence) is its business key:
// the ledger commits at most one row per key.
type Item struct {
	// entity is the first part of the business key (e.g. an account id), at
	// most 1024 bytes of UTF-8.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 1024",message="must be at most 1024 bytes of UTF-8: the ledger's unique index holds it"
	// +kubebuilder:validation:XValidation:rule="self.trim() != ''",message="must not be only white space"
	// +kubebuilder:validation:XValidation:rule=`!self.contains('\u0000')`,message="must not contain a NUL character, which PostgreSQL text cannot hold"
	Entity string `json:"entity"`
	// occurrence is the second part of the business key (e.g. a billing
	// period), at most 1024 bytes of UTF-8.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 1024",message="must be at most 1024 bytes of UTF-8: the ledger's unique index holds it"
	// +kubebuilder:validation:XValidation:rule="self.trim() != ''",message="must not be only white space"
	// +kubebuilder:validation:XValidation:rule=`!self.contains('\u0000')`,message="must not contain a NUL character, which PostgreSQL text cannot hold"
	Occurrence string `json:"occurrence"`
	// payload is any JSON value, stored with the ledger row and visible to
	// the effect as claimed.payload.
	// +optional
	Payload *apiextensionsv1.JSON `json:"payload,omitempty"`
}

// EffectSpec is the effect of processing items: exactly one of sql and
// processor.
//
// +kubebuilder:validation:XValidation:rule="has(self.sql) != has(self.processor)",message="effect needs exactly one of effect.sql and effect.processor"
type EffectSpec struct {
	// sql is one statement run in the ledger transaction over exactly the
	// items newly claimed in a chunk, which it reads from the temporary table
	// claimed(entity, occurrence, payload). A duplicate item's effect never
	// runs twice; if the statement fails, nothing of that chunk is committed.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=65536
	// +kubebuilder:validation:XValidation:rule="self.trim() != ''",message="must hold a statement, not only white space: remove effect to only record items"
	SQL string `json:"sql,omitempty"`

	// processor is a container of yours that processes the items: it runs
	// next to each worker (a native sidecar), and the worker POSTs it the
	// newly claimed items of each chunk, in the chunk's transaction; a key
	// commits only once the processor answered ok for it.
	// +optional
	Processor *ProcessorSpec `json:"processor,omitempty"`
}

// ProcessorSpec is a container that processes items over HTTP: the worker
// calls POST http://127.0.0.1:<port><path> with a JSON body of at most
// maxItemsPerCall items, at most maxCallsInFlight calls at once, and expects
// one result per item (see pkg/processor).
type ProcessorSpec struct {
	// image of the processor container.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image"`
	// command overrides the image's entrypoint.
	// +optional
	// +listType=atomic
	Command []string `json:"command,omitempty"`
	// args of the processor container.
	// +optional
	// +listType=atomic
	Args []string `json:"args,omitempty"`
	// env of the processor container.
	// +optional
	// +listType=map
	// +listMapKey=name
	Env []corev1.EnvVar `json:"env,omitempty"`
	// resources of the processor container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// port the processor listens on, on the pod's loopback at least; also
	// its readiness probe's port.
	// +optional
	// +kubebuilder:default=8080
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
	// path the worker POSTs items to.
	// +optional
	// +kubebuilder:default="/process"
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/[^?#\s]*$`
	Path string `json:"path,omitempty"`
	// timeout of one call. The chunk's transaction is open during its
	// calls, so a call that takes longer is abandoned and the chunk's items
	// are retried (then Failed); at most 10m.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('10m')",message="must be more than 0s and at most 10m"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// maxItemsPerCall bounds the items of one call: a chunk's newly claimed
	// items (up to chunkSize) go to the processor in calls of at most this
	// many, all within the chunk's transaction; each item commits only if
	// its own call answered ok for it, and one call that fails as a whole
	// commits nothing of the chunk.
	// +optional
	// +kubebuilder:default=100
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=50000
	MaxItemsPerCall int32 `json:"maxItemsPerCall,omitempty"`
	// maxCallsInFlight bounds how many calls of a chunk a worker has in
	// flight at once: the processor gets up to this many concurrent calls
	// from its worker.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	MaxCallsInFlight int32 `json:"maxCallsInFlight,omitempty"`
	// automountServiceAccountToken gives the processor container the
	// worker's token (the pod's ServiceAccount, bound to the pod) at
	// /var/run/secrets/kubernetes.io/serviceaccount. Off by default: only
	// the worker container has a token, and the install's admission policy
	// limits that token to writing the report annotation of its own pod, so
	// a processor that gets it can forge its shard's counts (never the
	// ledger's rows). Ask for it only for a processor that calls the API.
	// +optional
	// +kubebuilder:default=false
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`
	// readOnlyRootFilesystem of the processor container. On by default,
	// with a writable emptyDir at /tmp (64Mi); set it to false for a
	// processor that writes elsewhere in its image's filesystem.
	// +optional
	// +kubebuilder:default=true
	ReadOnlyRootFilesystem *bool `json:"readOnlyRootFilesystem,omitempty"`
}

// Timeouts bound what a run's SQL may take and how soon a lost database
// connection is noticed. A statement or lock timeout fails the chunk (or the
// batch's query) with nothing committed, and it is retried like any
// transient error, with back-off, within the shard's retries.
type Timeouts struct {
	// effectSeconds is the effect's statement timeout, per chunk; it bounds
	// each of the chunk's own ledger statements too (the claim, the checks
	// after the effect, a processor's take-back).
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	EffectSeconds int32 `json:"effectSeconds,omitempty"`
	// querySeconds is the batch query's statement timeout (the query runs
	// once per run, when its first shard starts).
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	QuerySeconds int32 `json:"querySeconds,omitempty"`
	// lockSeconds is how long any statement of a chunk (the claim of a key
	// another transaction holds uncommitted, the effect, a processor run's
	// take-back) or of the batch's query may wait for a lock (lock_timeout).
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	LockSeconds int32 `json:"lockSeconds,omitempty"`
	// networkSeconds is how soon a database connection whose server stopped
	// answering at the network level is dropped (TCP keep-alive and
	// TCP_USER_TIMEOUT, on both ends; the connect timeout unless the
	// connection string sets one). A long statement is not affected; an
	// effect or query with no answer at all within its own timeout plus this
	// (a hung server) is given up on and retried.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=3600
	NetworkSeconds int32 `json:"networkSeconds,omitempty"`
}

// OnExistingPolicy says what happens to an item already committed in the
// ledger.
// +kubebuilder:validation:Enum=Skip;Supersede
type OnExistingPolicy string

const (
	// OnExistingSkip counts an already committed item as already handled.
	OnExistingSkip OnExistingPolicy = "Skip"
	// OnExistingSupersede marks the committed row superseded and commits the
	// item again (its effect runs again).
	OnExistingSupersede OnExistingPolicy = "Supersede"
)

// OnPayloadChangePolicy says what happens to an already handled item whose
// payload differs from the committed row's.
// +kubebuilder:validation:Enum=Report;Fail
type OnPayloadChangePolicy string

const (
	// OnPayloadChangeReport counts the item in payloadChanged and as already
	// handled.
	OnPayloadChangeReport OnPayloadChangePolicy = "Report"
	// OnPayloadChangeFail counts the item in payloadChanged and as failed.
	OnPayloadChangeFail OnPayloadChangePolicy = "Fail"
)

// WorkerTemplate customises the worker pods of a run, with the fields of a
// Job's pod template that clusters need. runledger's own labels, annotations,
// environment variables and its /tmp volume cannot be overridden; the DSN
// stays in the Secret of spec.database (never in the template). The pod and
// container security contexts stay restricted (non-root, no privilege
// escalation, read-only root, all capabilities dropped).
// (A volumeMount naming no volume is refused by pod validation when the
// controller creates the pod, which stalls the run with the API's message:
// the CEL rule for it costs more than a CRD may spend.)
type WorkerTemplate struct {
	// metadata holds labels and annotations added to the worker pods.
	// +optional
	Metadata *WorkerPodMetadata `json:"metadata,omitempty"`
	// image overrides the manager's --worker-image for this run: a runledger
	// image of any release, whose entrypoint runs with the argument worker
	// (`runledger worker`; the manager's own image runs its worker binary).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image,omitempty"`
	// imagePullSecrets of the worker pods: Secrets in the run's namespace
	// holding the credentials to pull the worker image.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// resources of the worker container. Defaults: requests cpu 100m and
	// memory 128Mi, limit memory 256Mi.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// env adds environment variables to the worker container (e.g.
	// PGSSLROOTCERT). Names starting with RUNLEDGER_, and POD_NAME, are
	// runledger's.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, !e.name.startsWith('RUNLEDGER_') && e.name != 'POD_NAME')",message="env names starting with RUNLEDGER_, and POD_NAME, are set by runledger and cannot be overridden"
	Env []corev1.EnvVar `json:"env,omitempty"`
	// envFrom adds environment variables from ConfigMaps or Secrets; the
	// variables runledger sets always win over them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`
	// volumes of the worker pods (e.g. a Secret holding the CA of the
	// database's TLS certificate). The names tmp, processor-tmp,
	// runledger-token, runledger-batch and runledger-run are runledger's.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(v, v.name != 'tmp')",message="the volume name tmp is runledger's own (an emptyDir at /tmp): choose another name"
	// +kubebuilder:validation:XValidation:rule="self.all(v, !(v.name in ['processor-tmp', 'runledger-token', 'runledger-batch', 'runledger-run']))",message="the volume names processor-tmp, runledger-token, runledger-batch and runledger-run are runledger's own: choose another name"
	Volumes []corev1.Volume `json:"volumes,omitempty"`
	// volumeMounts of the worker container, naming workerTemplate.volumes.
	// /tmp, /dev/termination-log, /var/run/runledger and the ServiceAccount
	// token's directory /var/run/secrets/kubernetes.io/serviceaccount are
	// runledger's.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(m, m.mountPath != '/tmp' && m.mountPath != '/dev/termination-log')",message="/tmp and /dev/termination-log are runledger's own mount paths: mount elsewhere"
	// +kubebuilder:validation:XValidation:rule="self.all(m, !m.mountPath.startsWith('/var/run/runledger') && !m.mountPath.startsWith('/var/run/secrets/kubernetes.io/serviceaccount'))",message="/var/run/runledger and /var/run/secrets/kubernetes.io/serviceaccount are runledger's own mount paths (the batch and the worker's token): mount elsewhere"
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
	// nodeSelector of the worker pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// tolerations of the worker pods.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// affinity of the worker pods (node affinity, pod (anti-)affinity).
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// topologySpreadConstraints of the worker pods; select them with the
	// label processing.runledger.dev/run.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	// priorityClassName of the worker pods.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// runtimeClassName of the worker pods.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	RuntimeClassName *string `json:"runtimeClassName,omitempty"`
	// serviceAccountName of the worker pods; defaults to the manager's
	// --worker-service-account (runledger-worker). It needs the
	// runledger-worker ClusterRole bound in the run's namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
}

// WorkerPodMetadata is what a run adds to its worker pods' metadata.
type WorkerPodMetadata struct {
	// labels added to the worker pods. The app.kubernetes.io/name,
	// component, instance and managed-by labels and every
	// processing.runledger.dev/ label are the controller's.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('processing.runledger.dev/') && !(k in ['app.kubernetes.io/name', 'app.kubernetes.io/component', 'app.kubernetes.io/instance', 'app.kubernetes.io/managed-by']))",message="labels processing.runledger.dev/* and app.kubernetes.io/name, component, instance and managed-by are set by the controller and cannot be overridden"
	Labels map[string]string `json:"labels,omitempty"`
	// annotations added to the worker pods. processing.runledger.dev/
	// annotations are the controller's.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('processing.runledger.dev/'))",message="annotations processing.runledger.dev/* are set by the controller and cannot be overridden"
	Annotations map[string]string `json:"annotations,omitempty"`
}

// RunPhase is a simple, high-level summary of where a run is. Conditions
// carry the details.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed;Suspended
type RunPhase string

const (
	// RunPending: no worker pod has been created yet (e.g. waiting for the
	// Secret or ConfigMap).
	RunPending RunPhase = "Pending"
	// RunRunning: worker pods have been created and not every shard is done.
	RunRunning RunPhase = "Running"
	// RunSucceeded: every shard succeeded and failed <= maxFailedItems.
	RunSucceeded RunPhase = "Succeeded"
	// RunFailed: a shard failed for good (bad input, or backoffLimit
	// exceeded), or too many items failed.
	RunFailed RunPhase = "Failed"
	// RunSuspended: spec.suspend is true; no worker pod runs.
	RunSuspended RunPhase = "Suspended"
)

// ShardPhase is the state of one shard, as the controller sees its pods.
// +kubebuilder:validation:Enum=Pending;Running;Retrying;Succeeded;Failed
type ShardPhase string

const (
	// ShardPending: the shard's pod is not created or not yet running.
	ShardPending ShardPhase = "Pending"
	// ShardRunning: the shard's pod is running.
	ShardRunning ShardPhase = "Running"
	// ShardRetrying: the last attempt failed; the next one starts after a
	// back-off.
	ShardRetrying ShardPhase = "Retrying"
	// ShardSucceeded: the shard's pod exited 0.
	ShardSucceeded ShardPhase = "Succeeded"
	// ShardFailed: the shard failed for good.
	ShardFailed ShardPhase = "Failed"
)

// ProcessingRunStatus is the observed state of a ProcessingRun.
//
// The controller is its only writer (see contract.go: StatusSources says
// which fields of a shard's entry it copies from the worker's report).
type ProcessingRunStatus struct {
	// observedGeneration is the metadata.generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase is a one-word summary: Pending, Running, Succeeded, Failed or
	// Suspended.
	// +optional
	Phase RunPhase `json:"phase,omitempty"`

	// The run's counts, the sum of its shards' (computed by the controller).
	ItemCounts `json:",inline"`

	// active is the number of the run's worker pods that are live: created
	// and not finished, pods being stopped included, pods on a lost node
	// aside (counted by the controller, as a Job's status.active). Each
	// holds at most 2 connections to the ledger database.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Active int32 `json:"active"`

	// connections is the run's connection budget as the controller applies
	// it; absent when none applies (neither spec.database.maxConnections
	// nor the manager's default or maximum) and once the run is finished.
	// +optional
	Connections *ConnectionsStatus `json:"connections,omitempty"`

	// startTime is when the controller created the run's first pod.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// completionTime is when the run Succeeded or Failed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// duration is completionTime - startTime, to the second, once the run
	// is finished (the Duration column).
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`

	// shards has one entry per shard.
	// +optional
	// +listType=map
	// +listMapKey=index
	// +kubebuilder:validation:MaxItems=256
	Shards []ShardStatus `json:"shards,omitempty"`

	// failedItems, once an item failed, is the command that lists every
	// failed item of the run, with its error, from the ledger database
	// (runledger items NAME -n NAMESPACE --failed): each shard's entry
	// shows only its first few failures.
	// +optional
	// +kubebuilder:validation:MaxLength=600
	FailedItems string `json:"failedItems,omitempty"`

	// queue is the run's place in Kueue, for a run with the label
	// kueue.x-k8s.io/queue-name; absent otherwise.
	// +optional
	Queue *QueueStatus `json:"queue,omitempty"`

	// conditions: Complete, Failed and Suspended (as batch/v1 Job), Ready,
	// Reconciling and Stalled (as kstatus reads them), Admitted for a run
	// in a Kueue queue, and SynchronousReplication once a worker has read
	// what the ledger's server promises of a commit: True (reason
	// SynchronousStandby) when the server acknowledges a commit only once
	// a synchronous standby has it, so a failover to it loses no committed
	// item; False (reason AsynchronousReplication) when a failover can lose
	// the latest commits: the counts are proven from the ledger, an item
	// whose commit was lost is processed again, and a processor may get it
	// again with the same idempotency key. The message names the server's
	// synchronous_commit and synchronous_standby_names.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ItemCounts are the exact item counts of a shard or a run: once it is done,
// Completed + AlreadyHandled + Failed == Total. The run's status, each shard's
// entry, the worker's termination report and the counts floor on a pod all
// carry them.
type ItemCounts struct {
	// total is the number of items: of a run, declared in the batch (known up
	// front for inline items, otherwise the sum of what the shards have
	// reported); of a shard, in that shard, from its worker's report.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Total int64 `json:"total"`
	// completed is the number of items this run committed (its effect ran),
	// by any of its attempts; of a shard, from its worker's report. A shard
	// that stopped before its end (failed, interrupted) reports the rows the
	// ledger holds of it, those of its earlier attempts included.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Completed int64 `json:"completed"`
	// alreadyHandled is the number of items found already committed, by
	// another run or as a repeat inside the batch; of a shard, from its
	// worker's report.
	// +optional
	// +kubebuilder:validation:Minimum=0
	AlreadyHandled int64 `json:"alreadyHandled"`
	// failed is the number of items that failed (each shard's message says
	// why); of a shard, from its worker's report.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Failed int64 `json:"failed"`
	// payloadChanged is the number of keys found already committed by
	// another run of which at least one item of the batch (a key may be
	// listed more than once) has a payload that differs from the committed
	// row's (see spec.onPayloadChange), each key once: its items are counted
	// in alreadyHandled, or in failed with onPayloadChange: Fail. What
	// `runledger items --payload-changed` lists. Of a shard, from its
	// worker's report.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PayloadChanged int64 `json:"payloadChanged,omitempty"`
}

// Processed is how many items have an outcome.
func (c ItemCounts) Processed() int64 { return c.Completed + c.AlreadyHandled + c.Failed }

// Add adds o to c.
func (c *ItemCounts) Add(o ItemCounts) {
	c.Total += o.Total
	c.Completed += o.Completed
	c.AlreadyHandled += o.AlreadyHandled
	c.Failed += o.Failed
	c.PayloadChanged += o.PayloadChanged
}

// MaxEach is the field-wise maximum of c and o.
func (c ItemCounts) MaxEach(o ItemCounts) ItemCounts {
	return ItemCounts{
		Total:          max(c.Total, o.Total),
		Completed:      max(c.Completed, o.Completed),
		AlreadyHandled: max(c.AlreadyHandled, o.AlreadyHandled),
		Failed:         max(c.Failed, o.Failed),
		PayloadChanged: max(c.PayloadChanged, o.PayloadChanged),
	}
}

// Negative reports whether any count is below zero.
func (c ItemCounts) Negative() bool {
	return c.Total < 0 || c.Completed < 0 || c.AlreadyHandled < 0 || c.Failed < 0 || c.PayloadChanged < 0
}

// ShardStatus is the state of one shard, written by the controller: index,
// pod, phase, failedAttempts and lastFailedAttempt are its own decisions; the
// other fields it copies from the report of the shard's worker (see
// StatusSources in contract.go).
type ShardStatus struct {
	// index of the shard, 0 <= index < spec.workers (set by the controller).
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	Index int32 `json:"index"`

	// pod is the name of the shard's current pod, <run>-<index>-<attempt>
	// (decided by the controller).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Pod string `json:"pod,omitempty"`
	// phase of the shard (decided by the controller).
	// +optional
	Phase ShardPhase `json:"phase,omitempty"`
	// failedAttempts is the number of this shard's attempts that failed and
	// count against spec.backoffLimit, as a Job's status.failed counts pods
	// (counted by the controller). It never goes down: deleting failed pods
	// does not reset it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	FailedAttempts int32 `json:"failedAttempts,omitempty"`
	// lastFailedAttempt is the attempt of the latest failure counted in
	// failedAttempts (counted by the controller).
	// +optional
	// +kubebuilder:validation:Minimum=0
	LastFailedAttempt *int32 `json:"lastFailedAttempt,omitempty"`

	// attempt whose worker reported the counts below, 0 for the first pod
	// (from the worker's report).
	// +optional
	// +kubebuilder:validation:Minimum=0
	Attempt int32 `json:"attempt,omitempty"`
	// The shard's counts: the items of this shard and their outcomes, by any
	// attempt of this run (from the worker's report).
	ItemCounts `json:",inline"`
	// message is the worker's last word, e.g. its first item error (from the
	// worker's report; cut to 256 bytes while the shard runs, whole once it
	// finished).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
	// failures are the shard's first failed items, at most 3, each with its
	// key and why, cut short (from the worker's final report, so they
	// appear once the shard finished; a worker of an earlier release or one
	// that cannot reach the ledger database shows them earlier); the shards show 10
	// in all at most, the first shards' in index order. Every failed item
	// is recorded in the ledger database: status.failedItems lists them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=3
	Failures []FailureSample `json:"failures,omitempty"`
	// lastReportTime is when the worker made the report this entry shows
	// (from the worker's report; while the shard runs, when its worker
	// published it to the ledger database, to the second).
	// +optional
	LastReportTime *metav1.Time `json:"lastReportTime,omitempty"`
}

// FailureSample is one failed item as a shard's status shows it: its key
// and why, each part cut to its bound (marked "…"); the ledger database
// keeps the item's whole record.
type FailureSample struct {
	// entity of the item's key, cut to 256 bytes.
	// +required
	// +kubebuilder:validation:MaxLength=256
	Entity string `json:"entity"`
	// occurrence of the item's key, cut to 256 bytes.
	// +required
	// +kubebuilder:validation:MaxLength=256
	Occurrence string `json:"occurrence"`
	// class of the error: its SQLSTATE (e.g. 23503), or input,
	// processor-refused, processor-retries-exhausted, processor-unavailable,
	// effect-sandbox, unproven, payload-changed.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Class string `json:"class,omitempty"`
	// error is why the item failed, cut to 256 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Error string `json:"error,omitempty"`
}

// QueueStatus is a queued run's Kueue Workload and its admission.
type QueueStatus struct {
	// workload is the name of the Kueue Workload (kueue.x-k8s.io/v1beta2,
	// in the run's namespace) that stands for the run in its LocalQueue.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Workload string `json:"workload,omitempty"`
	// clusterQueue is the ClusterQueue that admitted the run; empty while
	// the run waits for admission or after an eviction.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ClusterQueue string `json:"clusterQueue,omitempty"`
}

// ConnectionBudgetSource says where a run's connection budget comes from.
// +kubebuilder:validation:Enum=Run;ManagerDefault;ManagerMaximum
type ConnectionBudgetSource string

const (
	// BudgetFromRun: spec.database.maxConnections, within the manager's
	// maximum.
	BudgetFromRun ConnectionBudgetSource = "Run"
	// BudgetFromManagerDefault: the run sets no maxConnections; the
	// manager's default applies.
	BudgetFromManagerDefault ConnectionBudgetSource = "ManagerDefault"
	// BudgetFromManagerMaximum: the manager's maximum, because the run
	// asks more or nothing at all (and the manager has no lower default).
	BudgetFromManagerMaximum ConnectionBudgetSource = "ManagerMaximum"
)

// ConnectionsStatus is a run's connection budget as the controller applies
// it (decided by the controller).
type ConnectionsStatus struct {
	// limit is the budget in force: the most connections to the ledger
	// database the run's worker pods may hold at once.
	// +required
	// +kubebuilder:validation:Minimum=2
	Limit int32 `json:"limit"`
	// source says where limit comes from: Run
	// (spec.database.maxConnections), ManagerDefault (the run sets none) or
	// ManagerMaximum (the manager's maximum caps what the run asks).
	// +required
	Source ConnectionBudgetSource `json:"source"`
	// parallelism is the most worker pods the run runs at once: limit / 2
	// (the connections of one worker pod), never more than spec.workers,
	// and for a run Kueue admitted never more than the pods it admitted.
	// +required
	// +kubebuilder:validation:Minimum=1
	Parallelism int32 `json:"parallelism"`
	// waiting is the number of shards that would start a pod now but wait
	// for the budget: they start as running pods finish.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Waiting int32 `json:"waiting,omitempty"`
}

// ManagedByController is spec.managedBy's value for runledger's own
// manager (the same as leaving it unset).
const ManagedByController = Group + "/controller"

// Condition types of a ProcessingRun.
const (
	// ConditionAdmitted, on a run in a Kueue queue, is True while Kueue
	// admits its Workload (reason Admitted, the message names the
	// ClusterQueue) and False while the run waits (Queued) or is evicted
	// (Evicted, with Kueue's reason); absent on other runs.
	ConditionAdmitted = "Admitted"
	// ConditionComplete is True once the run Succeeded (as batch/v1 Job).
	ConditionComplete = "Complete"
	// ConditionFailed is True once the run Failed (as batch/v1 Job).
	ConditionFailed = "Failed"
	// ConditionSuspended is True while the run is suspended, False after a
	// resume (as batch/v1 Job).
	ConditionSuspended = "Suspended"
	// ConditionReady is True once the run Succeeded: its desired outcome is
	// reached.
	ConditionReady = "Ready"
	// ConditionReconciling is True while the controller is still working
	// towards the outcome (kstatus: InProgress); absent otherwise.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when the run cannot progress without someone
	// acting: a missing Secret or ConfigMap, a worker image that cannot be
	// pulled, or a Failed run (kstatus: Failed); absent otherwise.
	ConditionStalled = "Stalled"
	// ConditionSynchronousReplication says what the ledger's server
	// promises of a commit, as the run's workers read it at start
	// (LedgerReplication): True when it acknowledges a commit only once a
	// synchronous standby has it, False when a failover can lose
	// acknowledged commits; absent until a worker reported it.
	ConditionSynchronousReplication = "SynchronousReplication"
)

// ManagedByOther reports whether spec.managedBy names another controller
// than runledger's manager.
func (s *ProcessingRunSpec) ManagedByOther() bool {
	return s.ManagedBy != nil && *s.ManagedBy != ManagedByController
}
