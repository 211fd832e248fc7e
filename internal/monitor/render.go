package monitor

import (
	"fmt"
	"strings"
	"time"
)

// Line renders an event for a terminal, one line, every field printable.
func (e Event) Line() string {
	var b strings.Builder
	b.WriteString(e.Received.Local().Format(time.DateTime))
	fmt.Fprintf(&b, " %-5s ", Printable(e.Type))
	who := func() string {
		if e.Process == nil {
			return "?"
		}
		s := Printable(e.Process.Binary)
		if e.Process.UID != nil {
			s += fmt.Sprintf(" uid=%d", *e.Process.UID)
		}
		if e.Process.PID != 0 {
			s += fmt.Sprintf(" pid=%d", e.Process.PID)
		}
		return s
	}
	switch e.Type {
	case TypeExec:
		b.WriteString(who())
		if e.Process != nil && e.Process.Args != "" {
			b.WriteString(" args: " + Printable(e.Process.Args))
		}
		if e.Parent != nil && e.Parent.Binary != "" {
			b.WriteString(" (parent " + Printable(e.Parent.Binary) + ")")
		}
	case TypeExit:
		b.WriteString(who())
		if e.Status != nil {
			fmt.Fprintf(&b, " status=%d", *e.Status)
		}
		if e.Signal != "" {
			b.WriteString(" signal=" + Printable(e.Signal))
		}
	case TypeFile:
		fmt.Fprintf(&b, "%s %s by %s", Printable(e.Op), Printable(e.Path), who())
	case TypeNet:
		fmt.Fprintf(&b, "%s %s -> %s:%d by %s", Printable(e.Proto), Printable(e.Src), Printable(e.Dst), e.Port, who())
	default:
		fmt.Fprintf(&b, "%s %s by %s", Printable(e.Kind), Printable(e.Function), who())
	}
	if e.Policy != "" {
		b.WriteString(" [" + Printable(e.Policy) + "]")
	}
	return b.String()
}
