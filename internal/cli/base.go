package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
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
			fmt.Fprintln(tw, "NAME\tSIZE\tSOURCE\tSHA256\tVERIFIED")
			for _, i := range imgs {
				sum := i.SHA256
				if len(sum) > 16 {
					sum = sum[:16]
				}
				fmt.Fprintf(tw, "%s\t%d MiB\t%s\t%s\t%s\n", i.Name, i.VirtualSize>>20, i.Source, sum, i.Verification())
			}
			return tw.Flush()
		},
	}
	jsonFlag(list.Flags(), &listJSON, "")
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
	var pullOpts struct {
		sha256, sha512 string // explicit checksum of the URL form
		mirror         string // replaces the catalogue's upstream URL prefix
		keyring        string // replaces a signed entry's keyring
		unsigned       bool   // a signed entry's checksum file taken without its signature
		list, json     bool
	}
	pull := &cobra.Command{
		Use:   "pull NAME [URL]",
		Short: "Download a cloud image from the catalogue, or from a URL, verifying its checksum",
		Long: `Download a base image and verify its checksum before installing it.

  abox base pull debian-12                   a catalogue image: its checksum comes
                                             from the distribution's SHA*SUMS file
  abox base pull NAME URL --sha256 HEX       any image, with the checksum you give
  abox base pull --list                      the catalogue

--mirror (or $` + image.EnvMirror + `) replaces the upstream URL prefix shown by
--list, so a local server that copies the upstream layout can stand in.

Where the distribution signs its checksum file (SIGNED in --list), abox checks
the signature with gpgv against the keyring on this host, never against a key
from the server, before it downloads the image; a missing or bad signature, or
a missing keyring, is refused. --keyring FILE names another keyring holding
the signer's key; --unsigned takes the checksum file on its https transfer
alone. abox base list says which bases were signature-checked.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if pullOpts.list {
				return exactArgs(0, "no arguments with --list")(cmd, args)
			}
			if len(args) < 1 || len(args) > 2 {
				return usageError{fmt.Errorf("%s takes a catalogue NAME, or a NAME and a URL (got %d arguments; see --help)", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			mirror := pullOpts.mirror
			if mirror == "" {
				mirror = os.Getenv(image.EnvMirror)
			}
			if pullOpts.list {
				type row struct {
					image.CatalogEntry
					ImageURL string `json:"image_url"`
					SumsURL  string `json:"sums_url"`
				}
				var rows []row
				for _, c := range image.Catalog() {
					imageURL, sumsURL, err := c.URLs(mirror)
					if err != nil {
						return usageError{err}
					}
					rows = append(rows, row{c, imageURL, sumsURL})
				}
				if pullOpts.json {
					return writeJSON(e.stdout, rows)
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tCHECKSUM\tSIGNED\tIMAGE\tDESCRIPTION")
				for _, r := range rows {
					signed := "no"
					if r.Signature != nil {
						signed = "yes"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, r.Algorithm, signed, r.ImageURL, r.Description)
				}
				return tw.Flush()
			}
			if pullOpts.json {
				return usageError{errors.New("--json goes with --list")}
			}
			name := args[0]
			var (
				pullImage func(*image.Store) (image.Image, error)
				verified  string
			)
			if len(args) == 1 {
				if pullOpts.sha256 != "" || pullOpts.sha512 != "" {
					return usageError{errors.New("--sha256 and --sha512 go with a URL: a catalogue image is checked against its distribution's checksum file")}
				}
				entry, err := image.LookupCatalog(name)
				if err != nil {
					return usageError{fmt.Errorf("%w; or give a URL and its --sha256 (see --help)", err)}
				}
				_, sumsURL, err := entry.URLs(mirror)
				if err != nil {
					return usageError{err}
				}
				if pullOpts.keyring != "" && pullOpts.unsigned {
					return usageError{errors.New("give one of --keyring and --unsigned, not both")}
				}
				if pullOpts.keyring != "" && entry.Signature == nil {
					return usageError{fmt.Errorf("--keyring: %s has no signature to check (%s)", name, entry.Unsigned)}
				}
				verified = fmt.Sprintf("%s verified against %s", entry.Algorithm, sumsURL)
				opts := image.CatalogPull{Mirror: mirror, Keyring: pullOpts.keyring, Unsigned: pullOpts.unsigned}
				pullImage = func(s *image.Store) (image.Image, error) {
					img, err := s.PullCatalog(cmd.Context(), name, entry, opts, progressPrinter(e.stderr))
					if err == nil {
						if img.Signed {
							verified += ", signed by " + img.SignedBy
						} else {
							verified += " (checksum not signature-checked)"
						}
					}
					return img, err
				}
			} else {
				if pullOpts.mirror != "" {
					return usageError{errors.New("--mirror goes with a catalogue name, not a URL")}
				}
				if pullOpts.keyring != "" || pullOpts.unsigned {
					return usageError{errors.New("--keyring and --unsigned go with a catalogue name; a URL is checked against the checksum you give")}
				}
				var want image.Checksum
				var err error
				switch {
				case pullOpts.sha256 != "" && pullOpts.sha512 != "":
					return usageError{errors.New("give one of --sha256 and --sha512, not both")}
				case pullOpts.sha256 != "":
					want, err = image.ParseChecksum(image.SHA256, pullOpts.sha256)
				case pullOpts.sha512 != "":
					want, err = image.ParseChecksum(image.SHA512, pullOpts.sha512)
				default:
					return usageError{errors.New("--sha256 or --sha512 is required with a URL: abox never installs an unverified image")}
				}
				if err != nil {
					return usageError{err}
				}
				verified = string(want.Algorithm) + " verified"
				pullImage = func(s *image.Store) (image.Image, error) {
					return s.PullChecksum(cmd.Context(), name, args[1], want, progressPrinter(e.stderr))
				}
			}
			s, err := e.images()
			if err != nil {
				return err
			}
			img, err := pullImage(s)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "pulled %s (%d MiB), %s\n", img.Name, img.VirtualSize>>20, verified)
			return nil
		},
	}
	pull.Flags().StringVar(&pullOpts.sha256, "sha256", "", "expected SHA-256 of the download from URL (hex)")
	pull.Flags().StringVar(&pullOpts.sha512, "sha512", "", "expected SHA-512 of the download from URL (hex)")
	pull.Flags().StringVar(&pullOpts.mirror, "mirror", "", "URL replacing the catalogue's upstream prefix (default $"+image.EnvMirror+")")
	pull.Flags().StringVar(&pullOpts.keyring, "keyring", "", "keyring file holding the key that signs a catalogue entry's checksum file (default: the distribution's keyring path)")
	pull.Flags().BoolVar(&pullOpts.unsigned, "unsigned", false, "accept a signed catalogue entry's checksum file without checking its signature")
	pull.Flags().BoolVar(&pullOpts.list, "list", false, "print the catalogue")
	jsonFlag(pull.Flags(), &pullOpts.json, "with --list, print JSON")
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
					if st.Base != base {
						continue
					}
					// An imported instance names its base but does not use it.
					if uses, err := instance.UsesBase(l, st); err != nil || uses {
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
