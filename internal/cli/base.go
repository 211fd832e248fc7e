package cli

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/instance"
)

func (e *env) images() (*image.Store, error) {
	l, err := e.layout()
	if err != nil {
		return nil, err
	}
	return image.NewStore(l.Root, image.ExecRunner{}, nil), nil
}

// progressPrinter renders image progress on stderr, one line per stage and
// a percentage at most every second.
func progressPrinter(w io.Writer) image.Progress {
	var last time.Time
	var lastStage string
	return func(stage string, done, total int64) {
		now := time.Now()
		if stage == lastStage && now.Sub(last) < time.Second && done != total {
			return
		}
		last, lastStage = now, stage
		if total > 0 {
			fmt.Fprintf(w, "%s: %d%% (%d/%d MiB)\n", stage, done*100/total, done>>20, total>>20)
		} else if done > 0 {
			fmt.Fprintf(w, "%s: %d MiB\n", stage, done>>20)
		} else {
			fmt.Fprintf(w, "%s\n", stage)
		}
	}
}

func newBaseCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "base", Short: "Manage base images instances are created from"}
	var listJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List base images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := e.images()
			if err != nil {
				return err
			}
			imgs, err := s.List()
			if err != nil {
				return err
			}
			if listJSON {
				if imgs == nil {
					imgs = []image.Image{}
				}
				return writeJSON(e.stdout, imgs)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tSOURCE\tSHA256")
			for _, i := range imgs {
				sum := i.SHA256
				if len(sum) > 16 {
					sum = sum[:16]
				}
				fmt.Fprintf(tw, "%s\t%d MiB\t%s\t%s\n", i.Name, i.VirtualSize>>20, i.Source, sum)
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	importCmd := &cobra.Command{
		Use:   "import NAME FILE",
		Short: "Import a qcow2 or raw disk image as a base",
		Args:  exactArgs(2, "a NAME and a FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := e.images()
			if err != nil {
				return err
			}
			img, err := s.Import(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "imported %s (%d MiB)\n", img.Name, img.VirtualSize>>20)
			return nil
		},
	}
	var sum string
	pull := &cobra.Command{
		Use:   "pull NAME URL",
		Short: "Download a base image, verifying its SHA-256",
		Args:  exactArgs(2, "a NAME and a URL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sum == "" {
				return usageError{errors.New("--sha256 is required: abox never installs an unverified image")}
			}
			s, err := e.images()
			if err != nil {
				return err
			}
			img, err := s.Pull(cmd.Context(), args[0], args[1], sum, progressPrinter(e.stderr))
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "pulled %s (%d MiB), sha256 verified\n", img.Name, img.VirtualSize>>20)
			return nil
		},
	}
	pull.Flags().StringVar(&sum, "sha256", "", "expected SHA-256 of the download (hex)")
	var mirror, cacheDir, name string
	build := &cobra.Command{
		Use:   "build debian-12",
		Short: "Build a cloud-init-ready Debian 12 base from a Debian mirror (offline-friendly)",
		Long: `Build a Debian 12 image with debootstrap from a Debian mirror: no cloud image
download needed. The build is cached (by recipe) under the cache directory, so
later builds and other ABOX_HOMEs reuse it.`,
		Args: exactArgs(1, "the recipe name (debian-12)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "debian-12" {
				return usageError{fmt.Errorf("unknown recipe %q: the only recipe is debian-12", args[0])}
			}
			if name == "" {
				name = args[0]
			}
			s, err := e.images()
			if err != nil {
				return err
			}
			b := image.Builder{Run: image.ExecRunner{}}
			built, err := b.BuildDebian12(cmd.Context(), mirror, cacheDir, progressPrinter(e.stderr))
			if err != nil {
				return err
			}
			if built.Cached {
				fmt.Fprintf(e.stderr, "using the cached build %s\n", built.Dir)
			}
			if _, err := s.Get(name); err == nil {
				fmt.Fprintf(e.stderr, "base %s is already installed\n", name)
				return nil
			}
			img, err := s.Import(cmd.Context(), name, built.Disk, built.ImportOptions()...)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "installed base %s (%d MiB)\n", img.Name, img.VirtualSize>>20)
			return nil
		},
	}
	build.Flags().StringVar(&mirror, "mirror", image.DefaultMirror, "Debian mirror URL")
	build.Flags().StringVar(&cacheDir, "cache-dir", image.DefaultCacheDir, "where built images are cached")
	build.Flags().StringVar(&name, "name", "", "base name to install it as (default: the recipe name)")
	remove := &cobra.Command{
		Use:     "remove NAME",
		Aliases: []string{"rm"},
		Short:   "Remove a base image (refused while an instance uses it)",
		Args:    exactArgs(1, "a NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := e.images()
			if err != nil {
				return err
			}
			l, err := e.layout()
			if err != nil {
				return err
			}
			inUse := func(base string) ([]string, error) {
				sts, err := instance.ListStates(l)
				if err != nil {
					return nil, err
				}
				var users []string
				for _, st := range sts {
					if st.Base == base {
						users = append(users, st.Name)
					}
				}
				return users, nil
			}
			if err := s.Remove(cmd.Context(), args[0], inUse); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "removed base %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(list, importCmd, pull, build, remove)
	return cmd
}
