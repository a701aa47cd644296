package cli

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/controllers"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/logging"
	"github.com/runledger/runledger/internal/version"
)

type managerOptions struct {
	leaderElect             bool
	leaderElectionNamespace string
	leaderElectionID        string
	metricsAddr             string
	metricsSecure           bool
	metricsCertDir          string
	pprof                   bool
	probeAddr               string
	workerImage             string
	workerServiceAccount    string
	workerPullPolicy        string
	workerNetworkPolicy     bool
	workerAPIServerPorts    []int32
	workerDatabaseCIDRs     []string
	workerObjectStoreCIDRs  []string
	workerObjectStorePorts  []int32
	workerDatabasePorts     []int32
	backoffBase             time.Duration
	backoffMax              time.Duration
	concurrency             int
	logging                 logging.Options
	// zapLevel and zapDevel are the deprecated --zap-log-level and
	// --zap-devel, read into logging.
	zapLevel        string
	zapDevel        bool
	watchNamespaces []string
	kueue           bool
	// connectionBudget is --run-max-connections-default and -maximum.
	connectionBudget v1alpha1.ConnectionBudgetSettings
}

func newManagerCommand() *cobra.Command { return managerCommand(&managerOptions{}) }

// managerCommand is the command that parses its flags into o.
func managerCommand(o *managerOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the ProcessingRun and ProcessingSchedule controllers (leader-elected): one worker pod per shard, exact status, one run per occurrence",
		Long: `Run the controller of ProcessingRuns (processing.runledger.dev/v1alpha1).

For each run it creates one worker pod per shard (named <run>-<shard>-<attempt>),
replaces failed ones after an exponential back-off up to spec.backoffLimit,
and keeps the run's status (phase, totals, conditions) from its pods and the
workers' reports. Leader election is on by default, so several replicas can
run; only the leader acts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runManager(cmd, o) },
	}
	f := cmd.Flags()
	f.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader (a Lease) so that only one replica acts at a time")
	f.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the manager pod's own namespace)")
	f.StringVar(&o.leaderElectionID, "leader-election-id", "runledger-manager.processing.runledger.dev", "name of the leader election Lease")
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", `address of the Prometheus metrics endpoint ("0" disables it)`)
	f.BoolVar(&o.metricsSecure, "metrics-secure", true, "serve metrics over HTTPS, to clients authorized by the API server (TokenReview and SubjectAccessReview)")
	f.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "directory holding the metrics endpoint's certificate and key (tls.crt, tls.key; e.g. a cert-manager Secret, config/prometheus); reread when they change. Default: a self-signed certificate made at start")
	f.BoolVar(&o.pprof, "pprof", false, "serve Go's profiles (net/http/pprof) at /debug/pprof/ on the metrics listener, behind its authentication (the ClusterRole runledger-pprof-reader)")
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	f.StringVar(&o.workerImage, "worker-image", "", "image of the worker pods, an image of this release or later (they run its "+v1alpha1.WorkerBinary+"); default: the manager's own image, by digest, read from its Pod ($"+envPodName+", $"+envPodNamespace+"); spec.workerTemplate.image overrides it per run (its pods run `runledger worker`)")
	f.StringVar(&o.workerServiceAccount, "worker-service-account", "runledger-worker", "service account of the worker pods, in each run's namespace; spec.workerTemplate.serviceAccountName overrides it")
	f.StringVar(&o.workerPullPolicy, "worker-image-pull-policy", "", "imagePullPolicy of the worker container: Always, IfNotPresent or Never (default: Kubernetes' default for the tag)")
	f.BoolVar(&o.workerNetworkPolicy, "worker-network-policy", true, "give each run a NetworkPolicy (runledger-<run>, owned by the run) before its first pod: nothing may connect to its worker pods, which may connect only to the API server (--worker-apiserver-ports), the database (--worker-database-cidrs, --worker-database-ports), DNS and, for a run with a spec.batch.object, the object store (--worker-object-store-cidrs, --worker-object-store-ports); your own NetworkPolicies selecting the run's pods add to it")
	f.Int32SliceVar(&o.workerAPIServerPorts, "worker-apiserver-ports", []int32{443, 6443}, "TCP ports of the API server as worker pods' connections reach it (after the kubernetes Service's translation: its endpoints' port)")
	f.StringSliceVar(&o.workerDatabaseCIDRs, "worker-database-cidrs", []string{"0.0.0.0/0", "::/0"}, "addresses of the ledger's database (or its pooler) in the worker pods' NetworkPolicy, as CIDRs; narrow them to your database's")
	f.Int32SliceVar(&o.workerDatabasePorts, "worker-database-ports", []int32{5432}, "TCP ports of the ledger's database (or its pooler) in the worker pods' NetworkPolicy")
	f.StringSliceVar(&o.workerObjectStoreCIDRs, "worker-object-store-cidrs", []string{"0.0.0.0/0", "::/0"}, "addresses of the S3-compatible stores of spec.batch.object in the NetworkPolicy of a run that reads one, as CIDRs; narrow them to your stores'")
	f.Int32SliceVar(&o.workerObjectStorePorts, "worker-object-store-ports", []int32{443}, "TCP ports of the S3-compatible stores of spec.batch.object in the NetworkPolicy of a run that reads one (MinIO listens on 9000 by default)")
	f.DurationVar(&o.backoffBase, "retry-backoff", controllers.DefaultBackoffBase, "back-off before a failed shard's first retry; it doubles with each failure")
	f.DurationVar(&o.backoffMax, "retry-backoff-max", controllers.DefaultBackoffMax, "longest back-off between a shard's retries")
	f.IntVar(&o.concurrency, "max-concurrent-reconciles", 4, "runs reconciled in parallel")
	f.Int32Var(&o.connectionBudget.Default, "run-max-connections-default", 0, fmt.Sprintf("connection budget of a run that sets no spec.database.maxConnections: the most connections to the ledger database its worker pods hold at once (%d per pod, so this / %d pods at once; the other shards wait); 0: none", v1alpha1.ConnectionsPerWorker, v1alpha1.ConnectionsPerWorker))
	f.Int32Var(&o.connectionBudget.Maximum, "run-max-connections-maximum", 0, "the most any run's connection budget may be: a run that asks more, or nothing (without --run-max-connections-default), gets this; 0: none")
	f.BoolVar(&o.kueue, "kueue", false, "queue the runs labelled kueue.x-k8s.io/queue-name in Kueue: each gets a Workload and waits for its admission (needs Kueue's CRDs and the ClusterRole runledger-manager-kueue)")
	f.StringSliceVar(&o.watchNamespaces, "watch-namespaces", nil, "reconcile only the runs in these namespaces (comma-separated), with Roles there instead of a ClusterRole (config/namespaced); default: every namespace")

	o.logging.AddFlags(f)
	f.StringVar(&o.zapLevel, "zap-log-level", "", "least level logged (use --log-level)")
	f.BoolVar(&o.zapDevel, "zap-devel", false, "text logs at debug level (use --log-format text --log-level debug)")
	_ = f.MarkDeprecated("zap-log-level", "use --log-level")
	_ = f.MarkDeprecated("zap-devel", "use --log-format text --log-level debug")
	goFlags := flag.NewFlagSet("kubeconfig", flag.ContinueOnError)
	if kubeconfig := flag.CommandLine.Lookup(ctrlconfig.KubeconfigFlagName); kubeconfig != nil {
		goFlags.Var(kubeconfig.Value, kubeconfig.Name, kubeconfig.Usage)
	}
	f.AddGoFlagSet(goFlags)
	return cmd
}

func runManager(cmd *cobra.Command, o *managerOptions) error {
	f := cmd.Flags()
	if o.zapDevel {
		if !f.Changed("log-format") {
			o.logging.Format = logging.FormatText
		}
		if !f.Changed("log-level") {
			o.logging.Level = "debug"
		}
	}
	if o.zapLevel != "" && !f.Changed("log-level") {
		o.logging.Level = o.zapLevel
	}
	logger, err := o.logging.New(cmd.ErrOrStderr(), logging.IsTerminal(cmd.ErrOrStderr()))
	if err != nil {
		return exitcode.BadInput(err)
	}
	ctrl.SetLogger(logger)
	log := ctrl.Log.WithName("manager")

	switch corev1.PullPolicy(o.workerPullPolicy) {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return exitcode.BadInput(fmt.Errorf("--worker-image-pull-policy %q: want Always, IfNotPresent or Never", o.workerPullPolicy))
	}

	workerNetwork, err := o.workerNetwork()
	if err != nil {
		return exitcode.BadInput(err)
	}
	if err := o.connectionBudget.Validate(); err != nil {
		return exitcode.BadInput(err)
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	if err := kueue.AddToScheme(scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}

	for _, ns := range o.watchNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return exitcode.BadInput(fmt.Errorf("--watch-namespaces: %q is not a namespace name: %s", ns, strings.Join(errs, "; ")))
		}
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return exitcode.BadInput(fmt.Errorf("kubernetes client configuration: %w", err))
	}

	metrics, err := o.metricsOptions()
	if err != nil {
		return exitcode.BadInput(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         controllers.CacheOptions(o.watchNamespaces...),
		Metrics:                       metrics,
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              o.leaderElectionID,
		LeaderElectionNamespace:       o.leaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true, // the process exits right after: hand over at once
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}

	// SIGTERM (the kubelet) or Ctrl-C stops the manager; with leader
	// election it hands the Lease over on the way out.
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	workerImage, err := workerImageFor(ctx, log, mgr.GetAPIReader(), o.workerImage)
	if err != nil {
		return err
	}

	r := &controllers.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("runledger-controller"),
		Pods: controllers.PodOptions{
			Image:              workerImage,
			ServiceAccountName: o.workerServiceAccount,
			ImagePullPolicy:    corev1.PullPolicy(o.workerPullPolicy),
		},
		WorkerNetwork:    workerNetwork,
		BackoffBase:      o.backoffBase,
		BackoffMax:       o.backoffMax,
		StatusInterval:   controllers.DefaultStatusInterval,
		Kueue:            o.kueue,
		ConnectionBudget: o.connectionBudget,
	}
	if err := r.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: o.concurrency}); err != nil {
		return fmt.Errorf("set up controller: %w", err)
	}
	sr := &controllers.ScheduleReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("runledger-controller"),
	}
	if err := sr.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: o.concurrency}); err != nil {
		return fmt.Errorf("set up schedule controller: %w", err)
	}
	if err := controllers.RegisterRunsMetric(mgr.GetCache()); err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	build := version.Get()
	if err := crmetrics.Registry.Register(buildInfoCollector(build)); err != nil {
		return fmt.Errorf("register build info metric: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	if err := addReadyzChecks(mgr); err != nil {
		return err
	}

	log.Info("starting manager", "version", build.Version, "commit", build.Commit, "leaderElect", o.leaderElect, "pprof", o.pprof, "workerImage", workerImage,
		"workerServiceAccount", o.workerServiceAccount, "workerNetworkPolicy", o.workerNetworkPolicy, "watchNamespaces", o.watchNamespaces,
		"runMaxConnectionsDefault", o.connectionBudget.Default, "runMaxConnectionsMaximum", o.connectionBudget.Maximum)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

// workerNetwork is what --worker-network-policy and the addresses beside it
// say worker pods may reach (nil: no NetworkPolicy).
func (o *managerOptions) workerNetwork() (*controllers.WorkerNetwork, error) {
	if !o.workerNetworkPolicy {
		return nil, nil
	}
	for _, fc := range []struct {
		flag  string
		cidrs []string
	}{{"--worker-database-cidrs", o.workerDatabaseCIDRs}, {"--worker-object-store-cidrs", o.workerObjectStoreCIDRs}} {
		for _, c := range fc.cidrs {
			if _, _, err := net.ParseCIDR(c); err != nil {
				return nil, fmt.Errorf("%s: %q is not a CIDR (such as 10.0.0.0/16 or 10.0.0.5/32)", fc.flag, c)
			}
		}
		if len(fc.cidrs) == 0 {
			return nil, fmt.Errorf("%s: name at least one CIDR (or --worker-network-policy=false)", fc.flag)
		}
	}
	for _, fp := range []struct {
		flag  string
		ports []int32
	}{{"--worker-apiserver-ports", o.workerAPIServerPorts}, {"--worker-database-ports", o.workerDatabasePorts}, {"--worker-object-store-ports", o.workerObjectStorePorts}} {
		flag, ports := fp.flag, fp.ports
		if len(ports) == 0 {
			return nil, fmt.Errorf("%s: name at least one port (or --worker-network-policy=false)", flag)
		}
		for _, p := range ports {
			if p < 1 || p > 65535 {
				return nil, fmt.Errorf("%s: %d is not a port (1 to 65535)", flag, p)
			}
		}
	}
	return &controllers.WorkerNetwork{APIServerPorts: o.workerAPIServerPorts, DatabaseCIDRs: o.workerDatabaseCIDRs, DatabasePorts: o.workerDatabasePorts,
		ObjectStoreCIDRs: o.workerObjectStoreCIDRs, ObjectStorePorts: o.workerObjectStorePorts}, nil
}

// metricsOptions are the metrics listener's: HTTPS behind the API server's
// TokenReview and SubjectAccessReview unless --metrics-secure=false, and
// Go's profiles on it only with --pprof.
func (o *managerOptions) metricsOptions() (metricsserver.Options, error) {
	metrics := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure, CertDir: o.metricsCertDir}
	if o.metricsSecure {
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	if o.pprof {
		if o.metricsAddr == "0" {
			return metricsserver.Options{}, fmt.Errorf("--pprof serves on the metrics listener: set --metrics-bind-address")
		}
		metrics.ExtraHandlers = pprofHandlers()
	}
	return metrics, nil
}

// buildInfoCollector is the runledger_build_info gauge: always 1, the build
// in its labels.
func buildInfoCollector(i version.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "runledger_build_info",
		Help: "Always 1; the labels name the running build (version, commit, Go version).",
		ConstLabels: prometheus.Labels{
			"version": i.Version, "commit": i.Commit, "goversion": i.GoVersion,
		},
	})
	g.Set(1)
	return g
}
