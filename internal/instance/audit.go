package instance

import (
	"path/filepath"

	"github.com/abox-dev/abox/internal/audit"
	"github.com/abox-dev/abox/internal/paths"
)

// Kinds of the audit records the orchestration writes (docs/audit.md).
const (
	AuditRevert = "snapshot_revert"
	AuditExport = "instance_export"
	AuditImport = "instance_import"
)

// recordAudit appends an event of instance name to its audit stream. The
// operation it records has happened, so a failure is a warning, not the
// operation's error.
func (m *Manager) recordAudit(name, kind string, data any) {
	if err := AppendAudit(m.Layout.Root, m.Layout.Instance(name), kind, data); err != nil {
		m.progress("warning: %s of %s done but not recorded in its audit stream: %v", kind, name, err)
	}
}

// AppendAudit appends one record to the audit stream of the instance whose
// files are f, under the host key of the data root.
func AppendAudit(root string, f paths.Instance, kind string, data any) error {
	key, err := audit.LoadKey(auditKeyIn(root))
	if err != nil {
		return err
	}
	s, err := audit.Open(audit.Config{Dir: AuditDir(f), Key: key})
	if err != nil {
		return err
	}
	if err := s.Append(kind, data); err != nil {
		s.Close()
		return err
	}
	return s.Close()
}

func auditKeyIn(root string) string { return filepath.Join(root, audit.KeyFile) }
