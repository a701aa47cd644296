package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/cli/workercmd"
	"github.com/runledger/runledger/internal/console"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/redact"
)

const consoleLong = `Serve a web console on this machine's loopback address: the runs of a
namespace as a live list (the API server's watch, pushed to the page), a
run's status, items/s, shards, conditions and Events, live; its failures by
class, failed, already handled and payload-changed items (from the ledger
database, as runledger items lists them) and its proof (as runledger verify
computes it); a key's history (as runledger key shows it); the schedules,
their next ticks in their time zone, missed ticks and the run of each
occurrence; and actions, each behind a confirmation: retry a run's failed
items (a run with batch.fromRun, once), suspend, resume, delete a finished
run; trigger or backfill a schedule's occurrences (as runledger schedule
does), suspend or resume it.

The console has no identity of its own: it reads and acts on the cluster
as the kubeconfig's user (as kubectl would: --kubeconfig, $KUBECONFIG,
~/.kube/config; --context), whose RBAC the API server enforces, and reads
the ledger database with the connection string runledger items takes
($RUNLEDGER_DATABASE_URL, --dsn-file or --dsn), which never reaches a page
or the log. Without a kubeconfig (or with --no-cluster) it shows the runs the
ledger database knows (those of runledger run, say); without a connection
string, the cluster alone.

It listens on loopback only (--address 127.0.0.1:PORT, [::1]:PORT or
localhost:PORT): anyone who can reach it acts as you. It answers only
requests whose Host is that address (no DNS rebinding), and a request that
changes anything only with its per-process token from one of its own pages
and an Origin of its own (no cross-site request). Stop it with Ctrl-C.`

type consoleOptions struct {
	address, namespace  string
	allNamespaces       bool
	kubeconfig, context string
	noCluster           bool
	since               time.Duration
}

func newConsoleCommand() *cobra.Command {
	var o consoleOptions
	cmd := &cobra.Command{
		Use:   "console [--address 127.0.0.1:7480] [--namespace NS | --all-namespaces]",
		Short: "Serve a web console on localhost: runs live, a run's items, Events and proof, keys, schedules, and their actions (as you)",
		Long:  consoleLong,
		Example: `  RUNLEDGER_DATABASE_URL=... runledger console -n billing
  runledger console --all-namespaces --dsn-file ledger.dsn --address 127.0.0.1:9000
  runledger console --no-cluster --dsn-file ledger.dsn    # the ledger alone: runs of runledger run`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.address, "address", "127.0.0.1:7480", "the loopback address and port to listen on (port 0: any free one)")
	f.StringVarP(&o.namespace, "namespace", "n", "", "the namespace whose runs the console lists and watches (default: the kubeconfig context's, as kubectl's)")
	f.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "list and watch the runs of every namespace (your RBAC must allow it)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	f.StringVar(&o.context, "context", "", "the kubeconfig context (default: its current one)")
	f.BoolVar(&o.noCluster, "no-cluster", false, "read the ledger database alone, as for the runs of runledger run")
	f.DurationVar(&o.since, "since", 7*24*time.Hour, "without a cluster: list the runs whose batch was fixed within this long")
	cmd.MarkFlagsMutuallyExclusive("namespace", "all-namespaces")
	addDatabaseFlags(cmd, "PostgreSQL connection string of the ledger (optional: without it the console shows the cluster alone)")
	return cmd
}

// loopbackAddress checks address is host:port of a loopback host.
func loopbackAddress(address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return exitcode.BadInput(fmt.Errorf("--address %q: %w", address, err))
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return nil
	}
	return exitcode.BadInput(fmt.Errorf("--address %q: the console listens on loopback only (127.0.0.1, [::1] or localhost): whoever reaches it acts as you; reach it from elsewhere through an SSH tunnel", address))
}

func (o *consoleOptions) run(cmd *cobra.Command) error {
	if err := loopbackAddress(o.address); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
	// The client's own messages (controller-runtime's) go to the same log.
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	opts := console.Options{Log: log, Since: o.since, Secrets: redact.New("")}
	if err := o.cluster(&opts); err != nil {
		return err
	}
	if hasDatabase(cmd) {
		pool, secrets, err := openOwnerPool(cmd)
		if err != nil {
			return err
		}
		defer pool.Close()
		opts.Store, opts.Secrets = ledger.NewStore(pool), secrets
	}
	if opts.Kube == nil && opts.Store == nil {
		return exitcode.BadInput(errors.New("no cluster (no kubeconfig, or --no-cluster) and no ledger database (pass --dsn-file or set " + envDatabaseURL + "): nothing to show"))
	}
	if opts.Kube == nil && !o.allNamespaces {
		// The ledger alone: the namespace asked, else every one.
		opts.Namespace = o.namespace
	}
	lc := net.ListenConfig{}
	ln, err := lc.Listen(ctx, "tcp", o.address)
	if err != nil {
		return exitcode.BadInput(fmt.Errorf("listening on %s: %w", o.address, err))
	}
	srv, err := console.New(opts, ln.Addr())
	if err != nil {
		_ = ln.Close()
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "runledger console: http://%s/ (%s; Ctrl-C stops it)\n", ln.Addr(), scopeOf(opts))
	go srv.Run(ctx)
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the console: %w", err)
	}
	return nil
}

// cluster sets opts' client (as the kubeconfig's user) and namespace,
// unless there is no kubeconfig or --no-cluster says so.
func (o *consoleOptions) cluster(opts *console.Options) error {
	if o.noCluster {
		return nil
	}
	cc := kubeConfig(o.kubeconfig, o.context)
	cfg, err := cc.ClientConfig()
	if clientcmd.IsEmptyConfig(err) && o.kubeconfig == "" {
		return nil
	}
	if err != nil {
		return exitcode.BadInput(fmt.Errorf("kubernetes client configuration (--no-cluster for the ledger alone): %w", err))
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	opts.Kube = c
	switch {
	case o.allNamespaces:
	case o.namespace != "":
		opts.Namespace = o.namespace
	default:
		if opts.Namespace, _, err = cc.Namespace(); err != nil {
			return exitcode.BadInput(fmt.Errorf("kubernetes namespace: %w", err))
		}
	}
	return nil
}

// hasDatabase: a connection string is given (--dsn, --dsn-file or the
// environment).
func hasDatabase(cmd *cobra.Command) bool {
	dsn, _ := cmd.Flags().GetString(flagDatabaseURL)
	file, _ := cmd.Flags().GetString(workercmd.FlagDSNFile)
	return dsn != "" || file != "" || os.Getenv(envDatabaseURL) != ""
}

func scopeOf(o console.Options) string {
	var s string
	switch {
	case o.Kube == nil:
		s = "no cluster"
	case o.Namespace == "":
		s = "cluster: all namespaces"
	default:
		s = "cluster: namespace " + o.Namespace
	}
	if o.Store != nil {
		return s + ", ledger database"
	}
	return s + ", no ledger database"
}
