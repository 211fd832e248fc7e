package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/steps"
)

// factHint is the advice for an error that carries the facts of a
// refusal (internal/instance's typed errors); "" for any other. It is
// the one place such advice is written: the errors themselves say only
// what is wrong.
func factHint(err error) string {
	var (
		taken  *instance.NameTakenError
		domain *instance.DomainTakenError
		base   *instance.BaseMissingError
		subnet *instance.SubnetInUseError
		bridge *instance.BridgeTakenError
	)
	switch {
	case errors.As(err, &taken) && taken.Import:
		return fmt.Sprintf("import under another name with --name NEW (or remove it first: abox remove %s)", taken.Name)
	case errors.As(err, &taken):
		return fmt.Sprintf("remove it with `abox remove %s`, or pick another name", taken.Name)
	case errors.As(err, &domain) && domain.Import:
		return fmt.Sprintf("an interrupted create or import leaves one: remove it with `abox remove --force %s`, or import under another name with --name NEW", domain.Name)
	case errors.As(err, &domain):
		return fmt.Sprintf("remove it with virsh (virsh undefine %s) or pick another name", domain.Domain)
	case errors.As(err, &base):
		return fmt.Sprintf("build one with `abox base build debian-12`, or `abox base import %s FILE`", base.Base)
	case errors.As(err, &subnet):
		return "leave --subnet out to pick a free one"
	case errors.As(err, &bridge) && bridge.By != "":
		return "rename one of them"
	case errors.As(err, &bridge):
		return fmt.Sprintf("remove it (ip link del %s) or pick another instance name", bridge.Bridge)
	}
	return ""
}

// EnvSteps, when set, makes create, import, start and revert print each
// of their steps as it ends, with its duration (stderr).
const EnvSteps = "ABOX_STEPS"

// stepPrinter writes the end of each step to w: what status and --json
// will show as phases.
func stepPrinter(w io.Writer) func(steps.Event) {
	return func(ev steps.Event) {
		switch ev.Phase {
		case steps.Started:
			return
		case steps.Failed, steps.UndoFailed:
			fmt.Fprintf(w, "step %d/%d %s: %s after %s: %v\n", ev.Index+1, ev.Total, ev.Step, ev.Phase, ev.Elapsed.Round(time.Millisecond), ev.Err)
		default:
			fmt.Fprintf(w, "step %d/%d %s: %s in %s\n", ev.Index+1, ev.Total, ev.Step, ev.Phase, ev.Elapsed.Round(time.Millisecond))
		}
	}
}
