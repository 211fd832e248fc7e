// Package project brings an instance to what an abox.yaml describes (abox
// up) and takes it down again (abox down), composing the instance
// orchestrator, the filters' API and the guest tools. It never calls a
// command.
package project

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// Deps are what up and down use.
type Deps struct {
	Layout  paths.Layout
	Manager *instance.Manager
	Access  guest.Access
	Trust   config.TrustStore
	// Out receives the provisioning scripts' stdout; Progress everything
	// else a user should see.
	Out, Progress io.Writer
	// BootTimeout bounds the wait for SSH and cloud-init; 0 is
	// instance.DefaultReadyTimeout.
	BootTimeout time.Duration
}

func (d Deps) progress(format string, args ...any) {
	fmt.Fprintf(d.Progress, format+"\n", args...)
}

// bindingFile records, in the instance directory, which abox.yaml made the
// instance and whether it was provisioned, so up never takes over an
// instance made otherwise and provisions only once.
const bindingFile = "project.json"

type binding struct {
	File        string    `json:"file"`
	CreatedAt   time.Time `json:"created_at"`
	Provisioned bool      `json:"provisioned"`
	// Secrets are the secret bindings up made from the file.
	Secrets []boundSecret `json:"secrets,omitempty"`
}

func loadBinding(l paths.Layout, name string) (binding, bool, error) {
	b, err := os.ReadFile(filepath.Join(l.InstanceDir(name), bindingFile))
	if errors.Is(err, fs.ErrNotExist) {
		return binding{}, false, nil
	}
	if err != nil {
		return binding{}, false, err
	}
	var bd binding
	if err := json.Unmarshal(b, &bd); err != nil {
		return binding{}, false, fmt.Errorf("instance %s: %s is damaged: %w", name, bindingFile, err)
	}
	return bd, true, nil
}

func saveBinding(l paths.Layout, name string, bd binding) error {
	b, err := json.MarshalIndent(bd, "", "  ")
	if err != nil {
		return err
	}
	// Private, as every file of the instance directory (instance/perms.go):
	// it names the abox.yaml, and so where the user's projects live.
	return fsutil.WriteFileAtomic(filepath.Join(l.InstanceDir(name), bindingFile), append(b, '\n'), instance.PrivateFile)
}

// ErrNotThisProject means the instance exists but another file, or no
// file, made it.
var ErrNotThisProject = errors.New("instance was not made from this abox.yaml")

// ErrUnsupported is a setting this abox cannot honour yet; refusing it is
// safer than running without it.
var ErrUnsupported = errors.New("not supported by this abox yet")

func (d Deps) api(name string) *api.Client { return api.NewClient(d.Layout.APISocket(name)) }
