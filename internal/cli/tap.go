package cli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/tap"
	"github.com/abox-dev/abox/internal/validate"
)

func newTapCmd(e *env) *cobra.Command {
	var o tap.Options
	var maxMB int64
	var secretKeys bool
	cmd := &cobra.Command{
		Use:   "tap NAME [-- TCPDUMP-ARGS...]",
		Short: "Capture an instance's traffic on its bridge, with the TLS keys to decrypt it",
		Long: `Run tcpdump on the instance's bridge: decoded packets on stdout, or a pcap
file with -o. SSH between the host and the guest is left out unless
--include-ssh. Arguments after -- go to tcpdump as they are.

The guest decides how much it sends, and the pcap file is on the host's
disk: a capture stops, on a whole packet and with an error saying so, before
the file would pass --max-size million bytes (1000, a gigabyte, by default;
0 for no cap), and at once if the disk fills. With --ring N it goes on in
FILE0, FILE1, ... instead and keeps the last N files, as tcpdump -C/-W does.

While the tap runs, the proxy writes the TLS session keys of the sessions it
intercepts to logs/keys.log in the instance directory (NSS key log format,
0600), so that Wireshark or tshark decrypt the guest's HTTPS:

  tshark -o tls.keylog_file:INSTANCE/logs/keys.log -r capture.pcap -Y http

Keys are written only for sessions that start while a tap runs; tunnelled
connections (--no-mitm, MITM exceptions) carry the origin's own TLS and
cannot be decrypted. The keys of a session that carried a secret the proxy
injected (abox secret bind) are left out, since the capture would show the
value; the tap says how many it left out, and --keys-of-secret-sessions
writes them too. Needs root (tcpdump) and a started instance.`,
		Example: `  abox tap dev
  abox tap dev -o dev.pcap -c 1000
  abox tap dev -o dev.pcap --max-size 100
  abox tap dev -o dev.pcap --max-size 100 --ring 5
  abox tap dev --filter 'udp port 53'
  abox tap dev -- -vv -s 0`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				if dash != 1 {
					return usageError{fmt.Errorf("abox tap takes one instance NAME before -- (got %d)", dash)}
				}
				o.Extra = args[1:]
			} else if len(args) != 1 {
				return usageError{fmt.Errorf("abox tap takes one instance NAME; put tcpdump arguments after --")}
			}
			if maxMB < 0 || maxMB > math.MaxInt64/1000/1000 {
				return usageError{fmt.Errorf("--max-size %d: want a size in millions of bytes, or 0 for no cap", maxMB)}
			}
			if (cmd.Flags().Changed("max-size") || cmd.Flags().Changed("ring")) && o.Write == "" {
				return usageError{errors.New("--max-size and --ring bound the pcap file: they take -o FILE")}
			}
			if o.Ring != 0 && maxMB == 0 {
				return usageError{errors.New("--ring keeps files of --max-size each: it takes a --max-size above 0")}
			}
			o.MaxBytes = maxMB * 1000 * 1000
			if err := o.CheckLimits(); err != nil {
				return usageError{err}
			}
			return e.runTap(cmd.Context(), name, o, secretKeys)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.Write, "output", "o", "", "write a pcap FILE instead of printing packets")
	f.IntVarP(&o.Count, "count", "c", 0, "stop after N packets")
	f.StringVar(&o.Filter, "filter", "", "BPF filter expression (ANDed with the SSH exclusion)")
	f.BoolVar(&o.IncludeSSH, "include-ssh", false, "keep host-guest SSH in the capture")
	f.Int64Var(&maxMB, "max-size", tap.DefaultMaxBytes/1000/1000, "with -o: stop before the file passes this many million bytes (0: no cap)")
	f.BoolVar(&secretKeys, "keys-of-secret-sessions", false, "also write the TLS keys of sessions that carried an injected secret (the capture then shows its value)")
	f.IntVar(&o.Ring, "ring", 0, "with -o: at --max-size go on in FILE0, FILE1, ... and keep the last N files, overwriting the oldest (tcpdump -C/-W)")
	return cmd
}

// apiKeyLog adapts the API client to tap.KeyLogSwitch.
type apiKeyLog struct{ c *api.Client }

func (a apiKeyLog) SetKeyLog(ctx context.Context, on bool) (string, error) {
	k, err := a.c.SetKeyLog(ctx, on)
	return k.Path, err
}

func (e *env) runTap(ctx context.Context, name string, o tap.Options, secretKeys bool) error {
	if err := validate.InstanceName(name); err != nil {
		return usageError{err}
	}
	l, err := e.layout()
	if err != nil {
		return err
	}
	st, err := instance.Load(l, name)
	if err != nil {
		return notFoundHint(name, err)
	}
	o.Bridge = st.Bridge
	if o.Write != "" {
		if o.Write, err = filepath.Abs(o.Write); err != nil {
			return err
		}
	}
	files := l.Instance(name)

	var keys *tap.Keys
	client := api.NewClient(files.APISocket)
	if !st.NoMITM {
		keys, err = tap.HoldKeys(ctx, apiKeyLog{client}, files.TapLock)
		if errors.Is(err, api.ErrNotRunning) {
			fmt.Fprintf(e.stderr, "warning: the filters of %s are not running, so no TLS keys are written (start it with `abox start %s`)\n", name, name)
		} else if err != nil {
			return fmt.Errorf("instance %s: turning the TLS key log on: %w", name, err)
		}
	}
	if secretKeys && keys == nil {
		return usageError{fmt.Errorf("--keys-of-secret-sessions: instance %s writes no TLS keys (it does not intercept, or its filters are not running)", name)}
	}
	var withheld0 uint64 // the proxy's count before this capture
	if keys != nil {
		k, err := client.KeyLog(ctx)
		if err != nil {
			keys.Release(context.WithoutCancel(ctx))
			return fmt.Errorf("instance %s: reading the TLS key log's state: %w", name, err)
		}
		withheld0 = k.Withheld
		if secretKeys {
			if _, err := client.KeyLogSecretSessions(ctx); err != nil {
				keys.Release(context.WithoutCancel(ctx))
				return fmt.Errorf("instance %s: opting the key log into secret sessions: %w", name, err)
			}
		}
	}
	if keys != nil {
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := keys.Release(rctx); err != nil {
				fmt.Fprintf(e.stderr, "warning: turning the TLS key log off: %v\n", err)
			}
		}()
	}
	ready := func() {
		what := "printing decoded packets"
		if o.Write != "" {
			what = "writing " + o.Write
			switch {
			case o.Ring > 0:
				what = fmt.Sprintf("writing %s … %s, %d files of up to %d MB, the oldest overwritten (--ring)",
					tap.RingName(o.Write, 0, o.Ring), tap.RingName(o.Write, o.Ring-1, o.Ring), o.Ring, o.MaxBytes/1000/1000)
			case o.MaxBytes > 0:
				what += fmt.Sprintf(" (up to %d MB, --max-size)", o.MaxBytes/1000/1000)
			}
		}
		fmt.Fprintf(e.stderr, "abox: capturing on %s (%s), %s; Ctrl-C stops\n", o.Bridge, describeFilter(o), what)
		switch {
		case keys != nil:
			pcap := o.Write
			if pcap == "" {
				pcap = "CAPTURE.pcap"
			}
			fmt.Fprintf(e.stderr, "abox: TLS keys of intercepted sessions go to %s while the tap runs; decrypt with\n  tshark -o tls.keylog_file:%s -r %s -Y http\n", keys.Path, keys.Path, pcap)
			if secretKeys {
				fmt.Fprintf(e.stderr, "abox: --keys-of-secret-sessions: the keys of sessions carrying an injected secret are written too; the capture shows its value\n")
			} else {
				fmt.Fprintf(e.stderr, "abox: the keys of sessions that carry an injected secret are left out (--keys-of-secret-sessions writes them)\n")
			}
		case st.NoMITM:
			fmt.Fprintf(e.stderr, "abox: %s does not intercept TLS (--no-mitm): HTTPS in the capture cannot be decrypted\n", name)
		}
	}
	err = tap.Run(ctx, o, e.stdout, e.stderr, ready)
	if keys != nil {
		// The key log has a cap of its own and stops at a failed write;
		// the sessions after that are in the capture, not in the log.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if k, kerr := client.KeyLog(kctx); kerr == nil {
			if k.Stopped != "" {
				fmt.Fprintf(e.stderr, "warning: the TLS key log stopped during the capture (%s): sessions after that cannot be decrypted\n", k.Stopped)
			}
			if n := k.Withheld - withheld0; n > 0 && k.Withheld >= withheld0 {
				fmt.Fprintf(e.stderr, "abox: left the keys of %d TLS session(s) out of %s: they carried an injected secret (--keys-of-secret-sessions writes them; sessions still open now are left out too)\n", n, keys.Path)
			}
		}
		cancel()
	}
	if errors.Is(err, tap.ErrCapReached) {
		return withHint(fmt.Errorf("instance %s: %w", name, err), "the file ends on a whole packet and opens as it is; capture more with --max-size MB (0: no cap), keep the last files with --ring N, or narrow it with --filter")
	}
	if errors.Is(err, syscall.ENOSPC) {
		return withHint(fmt.Errorf("instance %s: %w", name, err), "the disk is full: the file ends on the last whole packet written; free space or write elsewhere with -o")
	}
	if errors.Is(err, tap.ErrNoTcpdump) {
		return withHint(err, "install it with `apt-get install tcpdump` (`abox check-deps` lists what abox needs)")
	}
	if err != nil {
		return withHint(fmt.Errorf("instance %s: %w", name, err), fmt.Sprintf("the bridge exists only while the instance runs (`abox start %s`); tcpdump needs root", name))
	}
	return nil
}

func describeFilter(o tap.Options) string {
	if f := o.BPF(); f != "" {
		return "filter " + f
	}
	return "all traffic"
}
