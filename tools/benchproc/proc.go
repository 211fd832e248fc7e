package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// proc is a started process; its CPU time is read from /proc.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (o *options) spawn(cpu int, env, exe string, args ...string) (*proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), "ABOX_HOME="+filepath.Join(o.dir, "home"))
	if env != "" {
		cmd.Env = append(cmd.Env, env)
	}
	cmd.Stderr = io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := pin(cmd.Process.Pid, cpu); err != nil {
		cmd.Process.Kill()
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu returns the user+system CPU time of the process and its
// descendants, all threads (squid may fork helpers).
func (p *proc) cpu() time.Duration { return treeCPU(p.cmd.Process.Pid) }

func treeCPU(pid int) time.Duration {
	t := pidCPU(strconv.Itoa(pid))
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	for _, task := range tasks {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + task.Name() + "/children")
		for _, c := range strings.Fields(string(b)) {
			if cp, err := strconv.Atoi(c); err == nil {
				t += treeCPU(cp)
			}
		}
	}
	return t
}

// pidCPU reads one process's CPU time ("self" for this one).
func pidCPU(pid string) time.Duration {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// pin binds pid (0: this process, all threads) to one CPU.
func pin(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if pid != 0 {
		return unix.SchedSetaffinity(pid, &set)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, _ := strconv.Atoi(t.Name())
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return err
		}
	}
	return nil
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitTCP(addr string) error {
	for range 200 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s", addr)
}

func waitDNS(addr string) error {
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	for range 100 {
		if _, _, err := c.Exchange(new(dns.Msg).SetQuestion("a0000.allowed.test.", dns.TypeA), addr); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no DNS answers on %s", addr)
}
