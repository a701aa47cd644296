package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/schedule"
	"github.com/runledger/runledger/internal/schedule/manualrun"
)

// maxBackfill bounds the runs one backfill creates.
const maxBackfill = 1000

type scheduleOptions struct {
	kubeconfig, context, namespace string
	// newClient builds the client (tests replace it).
	newClient func(o *scheduleOptions) (client.Client, string, error)
}

func newScheduleCommand() *cobra.Command { return newScheduleCommandWith(kubeClient) }

func newScheduleCommandWith(newClient func(o *scheduleOptions) (client.Client, string, error)) *cobra.Command {
	o := &scheduleOptions{newClient: newClient}
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Start a ProcessingSchedule's runs by hand: one occurrence (trigger) or a range of ticks (backfill)",
		Long: `Create the runs of a ProcessingSchedule's occurrences by hand, with the names, labels,
owner and spec.occurrence the controller gives them: a manual run of an occurrence
the schedule also fires is one run (whoever comes second finds it there).

The Kubernetes connection is kubectl's: --kubeconfig (default $KUBECONFIG or
~/.kube/config), --context, and --namespace (default the context's namespace).

Without this CLI, the annotation processing.runledger.dev/trigger=OCCURRENCE on the
schedule (kubectl annotate) makes the controller create that occurrence's run the same
way; status.trigger says what became of it (docs/recurring-batches.md).`,
	}
	f := cmd.PersistentFlags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default $KUBECONFIG, then ~/.kube/config, then in-cluster)")
	f.StringVar(&o.context, "context", "", "the kubeconfig context to use")
	f.StringVarP(&o.namespace, "namespace", "n", "", "namespace of the schedule (default: the context's)")
	cmd.AddCommand(newTriggerCommand(o), newBackfillCommand(o))
	return cmd
}

func newTriggerCommand(o *scheduleOptions) *cobra.Command {
	var occurrence string
	cmd := &cobra.Command{
		Use:   "trigger NAME [--occurrence X]",
		Short: "Create the run of one occurrence now (by default the occurrence of the current minute)",
		Long: `Create the run of one occurrence of schedule NAME now: --occurrence X exactly as given,
or else the occurrence the schedule's format and shift make of the current minute in its
time zone. If that occurrence's run exists already (the schedule fired it, or an earlier
trigger), nothing is created and its name is printed. Suspension and concurrencyPolicy
do not apply to a manual run.`,
		Example: `  runledger schedule trigger invoices -n billing                  # the current minute's occurrence
  runledger schedule trigger invoices -n billing --occurrence 2026-10`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sched, err := o.schedule(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			p, err := schedule.Parse(sched.Name, &sched.Spec)
			if err != nil {
				return exitcode.BadInput(fmt.Errorf("schedule %s: %w", sched.Name, err))
			}
			at := time.Time{}
			if !cmd.Flags().Changed("occurrence") {
				tick := p.TriggerTick(time.Now())
				occurrence, at = tick.Occurrence, tick.Time
			}
			if err := checkOccurrence(occurrence); err != nil {
				return err
			}
			return createRuns(cmd.Context(), cmd.OutOrStdout(), c, sched, []schedule.Tick{{Occurrence: occurrence, Time: at}}, schedule.CreatedByTrigger)
		},
	}
	cmd.Flags().StringVar(&occurrence, "occurrence", "", "the occurrence to run, exactly (e.g. 2026-10)")
	return cmd
}

func newBackfillCommand(o *scheduleOptions) *cobra.Command {
	var from, to string
	cmd := &cobra.Command{
		Use:   "backfill NAME --from X --to Y",
		Short: "Create the runs of every tick of the schedule from X to Y (inclusive), oldest first",
		Long: `Create the run of each tick of schedule NAME whose scheduled time is from --from up to
and including --to, each with its own occurrence (so backfilling months that already ran
finds their runs and creates nothing for them; their items are in the ledger anyway).
X and Y are wall-clock times in the schedule's time zone: 2006-01, 2006-01-02,
2006-01-02T15:04 or 2006-01-02T15:04:05, or RFC 3339 times with an offset. At most
1000 runs per backfill. Runs are created whatever catchUp, concurrencyPolicy and
suspend say.`,
		Example: `  runledger schedule backfill invoices -n billing --from 2026-01 --to 2026-06`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, sched, err := o.schedule(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			p, err := schedule.Parse(sched.Name, &sched.Spec)
			if err != nil {
				return exitcode.BadInput(fmt.Errorf("schedule %s: %w", sched.Name, err))
			}
			fromW, err := p.ParseWall(from)
			if err != nil {
				return exitcode.BadInput(fmt.Errorf("--from: %w", err))
			}
			toW, err := p.ParseWall(to)
			if err != nil {
				return exitcode.BadInput(fmt.Errorf("--to: %w", err))
			}
			ticks, err := p.Backfill(sched.Spec.Schedule, fromW, toW, maxBackfill)
			if err != nil {
				return exitcode.BadInput(fmt.Errorf("--from %s --to %s: %w", from, to, err))
			}
			return createRuns(cmd.Context(), cmd.OutOrStdout(), c, sched, ticks, schedule.CreatedByBackfill)
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "first scheduled time (inclusive), in the schedule's time zone")
	cmd.Flags().StringVar(&to, "to", "", "last scheduled time (inclusive), in the schedule's time zone")
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

// checkOccurrence applies the run CRD's rules on spec.occurrence, so the
// error is ours and says which flag.
func checkOccurrence(occ string) error {
	if msg := v1alpha1.KeyPartProblem(occ); msg != "" {
		return exitcode.BadInput(fmt.Errorf("--occurrence %s", msg))
	}
	return nil
}

// createRuns creates the run of each tick's occurrence and prints a line
// per run: "created NAME (occurrence X)" or "exists NAME (occurrence X)". A
// name taken by a run that is not this schedule's of that occurrence is an
// error.
func createRuns(ctx context.Context, out io.Writer, c client.Client, sched *v1alpha1.ProcessingSchedule, ticks []schedule.Tick, by string) error {
	for _, t := range ticks {
		name, created, err := manualrun.Create(ctx, c, sched, t.Occurrence, t.Time, by)
		switch {
		case apierrors.IsInvalid(err):
			return exitcode.BadInput(err)
		case err != nil:
			return err
		case created:
			fmt.Fprintf(out, "created processingrun/%s (occurrence %s)\n", name, t.Occurrence)
		default:
			fmt.Fprintf(out, "exists processingrun/%s (occurrence %s)\n", name, t.Occurrence)
		}
	}
	return nil
}

// schedule reads the named schedule.
func (o *scheduleOptions) schedule(ctx context.Context, name string) (client.Client, *v1alpha1.ProcessingSchedule, error) {
	c, ns, err := o.newClient(o)
	if err != nil {
		return nil, nil, err
	}
	sched := &v1alpha1.ProcessingSchedule{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sched); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, exitcode.BadInput(fmt.Errorf("processingschedule %s not found in namespace %s", name, ns))
		}
		return nil, nil, fmt.Errorf("reading processingschedule %s/%s: %w", ns, name, err)
	}
	return c, sched, nil
}

// kubeClient is a client configured as kubectl would be, and the namespace.
func kubeClient(o *scheduleOptions) (client.Client, string, error) {
	cc := kubeConfig(o.kubeconfig, o.context)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", exitcode.BadInput(fmt.Errorf("kubernetes client configuration: %w", err))
	}
	ns := o.namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, "", exitcode.BadInput(fmt.Errorf("kubernetes namespace: %w", err))
		}
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, "", fmt.Errorf("scheme: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client: %w", err)
	}
	return c, ns, nil
}
