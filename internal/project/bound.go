package project

import "github.com/abox-dev/abox/internal/paths"

// BoundFile names the abox.yaml that made the instance, if one did: up
// keeps such an instance's allowlist to the file's, so a change to it
// belongs in the file (and its trust), not in the instance.
func BoundFile(l paths.Layout, name string) (file string, bound bool, err error) {
	bd, ok, err := loadBinding(l, name)
	return bd.File, ok, err
}
