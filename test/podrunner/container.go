package podrunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Waiting reasons the kubelet uses.
const (
	reasonConfigError = "CreateContainerConfigError"
	reasonImage       = "ErrImagePull"
	reasonBackOff     = "CrashLoopBackOff"
	reasonCreating    = "ContainerCreating"
	reasonInitWaiting = "PodInitializing"
)

// container is one container of a pod: its runs, restarts and probes.
type container struct {
	pod     *Pod
	spec    corev1.Container
	init    bool // an init container
	sidecar bool // an init container with restartPolicy Always
	logs    *logBuffer
	out     io.Writer
	line    *lineWriter
	dir     string

	cancel   context.CancelFunc
	finished chan struct{}

	mu           sync.Mutex
	img          *image
	rootReady    bool
	runs         int
	state        corev1.ContainerState
	lastState    corev1.ContainerState
	restartCount int32
	ready        bool
	started      bool
	completed    bool
	kill         chan string
	// last is the sandbox of the latest run (View).
	last *sandboxSpec
}

func newContainer(p *Pod, spec corev1.Container, init bool) *container {
	c := &container{
		pod: p, spec: spec, init: init,
		sidecar: init && spec.RestartPolicy != nil && *spec.RestartPolicy == corev1.ContainerRestartPolicyAlways,
		logs:    &logBuffer{},
		dir:     filepath.Join(p.dir, "containers", spec.Name),
		state:   corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonInitWaiting}},
	}
	if init {
		c.state.Waiting.Reason = reasonCreating
	}
	c.line = &lineWriter{prefix: p.ns + "/" + p.name + "/" + spec.Name + ": ", out: p.r.opts.Log}
	c.out = io.MultiWriter(c.logs, c.line)
	return c
}

func (c *container) status() corev1.ContainerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := corev1.ContainerStatus{
		Name:                 c.spec.Name,
		Image:                c.spec.Image,
		Ready:                c.ready,
		Started:              &c.started,
		RestartCount:         c.restartCount,
		State:                c.state,
		LastTerminationState: c.lastState,
	}
	started := c.started
	s.Started = &started
	if c.img != nil {
		s.ImageID = c.img.digest
		if s.ImageID == "" {
			s.ImageID = "podrunner://binary/" + filepath.Base(c.img.binary)
		}
	}
	if c.runs > 0 {
		s.ContainerID = fmt.Sprintf("podrunner://%s/%d", c.pod.obj.UID, c.runs)
	}
	return s
}

func (c *container) isReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}

func (c *container) set(f func()) {
	c.mu.Lock()
	f()
	c.mu.Unlock()
	c.pod.notify()
}

// start runs the container until stop; once: until it exits 0 (a regular init
// container).
func (c *container) start(once bool) {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.finished = make(chan struct{})
	c.pod.r.go_(func() {
		defer close(c.finished)
		c.loop(ctx, once)
	})
}

func (c *container) stop() {
	if c.cancel == nil {
		return
	}
	c.cancel()
	<-c.finished
	c.line.flush()
}

func (c *container) waitStarted(ctx context.Context) bool {
	return c.waitFor(ctx, func() bool { return c.started })
}

func (c *container) waitCompleted(ctx context.Context) bool {
	return c.waitFor(ctx, func() bool { return c.completed })
}

func (c *container) waitFor(ctx context.Context, cond func() bool) bool {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

func (c *container) loop(ctx context.Context, once bool) {
	backOff := c.pod.r.opts.BackOff
	for {
		ran, exitCode := c.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if once && ran && exitCode == 0 {
			c.set(func() { c.completed = true })
			return
		}
		if ran {
			c.set(func() {
				c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
					Reason:  reasonBackOff,
					Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", backOff, c.spec.Name, c.pod.name, c.pod.ns, c.pod.obj.UID),
				}}
			})
		}
		if !sleep(ctx, backOff) {
			return
		}
		backOff = min(2*backOff, c.pod.r.opts.MaxBackOff)
	}
}

// runOnce creates and runs the container once. ran is false when it could not
// be created (the state says why).
func (c *container) runOnce(ctx context.Context) (ran bool, exitCode int32) {
	spec, hostFile, err := c.prepare(ctx)
	if err != nil {
		reason := reasonConfigError
		if errors.Is(err, errUnknownImage) {
			reason = reasonImage
			c.pod.setFatal(err)
		}
		fmt.Fprintf(c.pod.r.opts.Log, "%s/%s/%s: %s: %v\n", c.pod.ns, c.pod.name, c.spec.Name, reason, err)
		c.set(func() {
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: err.Error()}}
		})
		return false, 0
	}
	c.set(func() { c.last = spec })
	logStart := len(c.logs.String())
	cmd, err := c.spawn(spec)
	var term corev1.ContainerStateTerminated
	if err != nil {
		term = corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error()}
		fmt.Fprintf(c.pod.r.opts.Log, "%s/%s/%s: start: %v\n", c.pod.ns, c.pod.name, c.spec.Name, err)
	} else {
		term = c.supervise(ctx, cmd)
		term.Message = c.terminationMessage(hostFile, term.ExitCode, logStart)
	}
	term.FinishedAt = metav1.Now().Rfc3339Copy()
	c.set(func() {
		if c.state.Running != nil {
			term.StartedAt = c.state.Running.StartedAt
		}
		c.state = corev1.ContainerState{Terminated: &term}
		c.lastState = corev1.ContainerState{Terminated: &term}
		c.ready, c.started = false, false
	})
	return true, term.ExitCode
}

// spawn starts the sandbox helper and waits until it has exec'ed the
// container's program (or failed to).
func (c *container) spawn(spec *sandboxSpec) (*exec.Cmd, error) {
	c.mu.Lock()
	c.runs++
	run := c.runs
	c.mu.Unlock()
	specPath := filepath.Join(c.dir, fmt.Sprintf("sandbox-%d.json", run))
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(specPath, b, 0o600); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer statusR.Close()
	cmd := exec.Command(self)
	cmd.Env = []string{sandboxEnv + "=" + specPath}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.ExtraFiles = []*os.File{statusW}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// its own mount namespace, and its own host name (the pod's name, as
		// a kubelet gives it: client-go's leader election names the holder
		// after it)
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
		Pdeathsig:  syscall.SIGKILL,
		Setpgid:    true,
	}
	err = cmd.Start()
	statusW.Close()
	if err != nil {
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	msg, _ := io.ReadAll(statusR)
	if len(msg) > 0 {
		_ = cmd.Wait()
		return nil, errors.New(string(msg))
	}
	c.mu.Lock()
	if run > 1 {
		c.restartCount++
	}
	c.mu.Unlock()
	return cmd, nil
}

// supervise runs probes while the process lives and stops it when ctx ends
// or the liveness probe fails.
func (c *container) supervise(ctx context.Context, cmd *exec.Cmd) corev1.ContainerStateTerminated {
	kill := make(chan string, 1)
	c.set(func() {
		c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now().Rfc3339Copy()}}
		c.kill = kill
	})
	probeCtx, stopProbes := context.WithCancel(ctx)
	var probes sync.WaitGroup
	if !c.init || c.sidecar {
		probes.Add(1)
		go func() {
			defer probes.Done()
			c.probe(probeCtx, kill)
		}()
	} else {
		c.set(func() { c.started = true })
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-ctx.Done():
		waitErr = c.terminate(cmd, exited)
	case why := <-kill:
		fmt.Fprintf(c.pod.r.opts.Log, "%s/%s/%s: %s, will be restarted\n", c.pod.ns, c.pod.name, c.spec.Name, why)
		waitErr = c.terminate(cmd, exited)
	}
	stopProbes()
	probes.Wait()
	c.line.flush()
	term := corev1.ContainerStateTerminated{Reason: "Completed"}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			term.ExitCode = 128 + int32(ws.Signal())
			term.Signal = int32(ws.Signal())
		} else {
			term.ExitCode = int32(ws.ExitStatus())
		}
	} else if waitErr != nil {
		term.ExitCode = 128
	}
	if term.ExitCode != 0 {
		term.Reason = "Error"
	}
	return term
}

// terminate sends SIGTERM, waits the grace period, then SIGKILL.
func (c *container) terminate(cmd *exec.Cmd, exited chan error) error {
	grace := 30 * time.Second
	if g := c.pod.obj.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	grace = min(grace, c.pod.r.opts.MaxGracePeriod)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-exited:
		return err
	case <-t.C:
		_ = cmd.Process.Kill()
		return <-exited
	}
}

// terminationMessage is what the container wrote to its terminationMessagePath
// or, with FallbackToLogsOnError and a failure, the tail of its log.
func (c *container) terminationMessage(hostFile string, exitCode int32, logStart int) string {
	b, _ := os.ReadFile(hostFile)
	if len(b) > 4096 {
		b = b[:4096]
	}
	if len(b) == 0 && exitCode != 0 && c.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
		return c.logs.tail(logStart)
	}
	return string(b)
}

// prepare resolves image, env, command, user and mounts of the next run.
func (c *container) prepare(ctx context.Context) (*sandboxSpec, string, error) {
	p := c.pod
	where := fmt.Sprintf("pod %s/%s container %s", p.ns, p.name, c.spec.Name)
	c.mu.Lock()
	img := c.img
	c.mu.Unlock()
	if img == nil {
		var err error
		if img, err = p.r.opts.Images.resolve(c.spec.Image); err != nil {
			return nil, "", fmt.Errorf("podrunner: %s: %w", where, err)
		}
		c.set(func() { c.img = img })
	}
	if err := c.checkProbes(); err != nil {
		return nil, "", fmt.Errorf("%s: %w", where, err)
	}
	root := filepath.Join(c.dir, "root")
	if !c.rootReady {
		if err := img.unpack(root); err != nil {
			return nil, "", fmt.Errorf("%s: image %s: %w", where, c.spec.Image, err)
		}
		c.rootReady = true
	}
	envList, err := p.containerEnv(ctx, &c.spec)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", where, err)
	}
	env := map[string]string{}
	var envOut []string
	setEnv := func(k, v string) {
		if _, ok := env[k]; !ok {
			envOut = append(envOut, k)
		}
		env[k] = v
	}
	for _, kv := range img.config.Env {
		k, v, _ := strings.Cut(kv, "=")
		setEnv(k, v)
	}
	setEnv("HOSTNAME", p.name)
	for _, e := range envList {
		setEnv(e.Name, e.Value)
	}
	spec := &sandboxSpec{Root: root, WorkingDir: img.config.WorkingDir, Hostname: p.name}
	for _, k := range envOut {
		spec.Env = append(spec.Env, k+"="+env[k])
	}
	if c.spec.WorkingDir != "" {
		spec.WorkingDir = c.spec.WorkingDir
	}
	lookup := func(n string) (string, bool) { v, ok := env[n]; return v, ok }
	var cmd, args []string
	for _, a := range c.spec.Command {
		cmd = append(cmd, expand(a, lookup))
	}
	for _, a := range c.spec.Args {
		args = append(args, expand(a, lookup))
	}
	switch {
	case len(cmd) > 0:
		spec.Argv = append(cmd, args...)
	case len(args) > 0:
		spec.Argv = append(append(spec.Argv, img.config.Entrypoint...), args...)
	default:
		spec.Argv = append(append(spec.Argv, img.config.Entrypoint...), img.config.Cmd...)
	}
	if err := c.user(img, spec); err != nil {
		return nil, "", fmt.Errorf("%s: %w", where, err)
	}
	p.mu.Lock()
	mounts, err := p.containerMounts(&c.spec, env)
	p.mu.Unlock()
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", where, err)
	}
	has := func(target string) bool {
		for _, m := range mounts {
			if filepath.Clean(m.Target) == target {
				return true
			}
		}
		return false
	}
	if img.binary != "" {
		mounts = append([]sandboxMount{{Source: img.binary, Target: binaryDir + "/" + filepath.Base(img.binary), ReadOnly: true}}, mounts...)
	}
	if !has("/tmp") {
		tmp := filepath.Join(c.dir, "tmp")
		if err := os.MkdirAll(tmp, 0o777); err != nil {
			return nil, "", err
		}
		_ = os.Chmod(tmp, 0o1777)
		mounts = append(mounts, sandboxMount{Source: tmp, Target: "/tmp"})
	}
	if !has("/etc/hosts") {
		mounts = append(mounts, sandboxMount{Source: filepath.Join(p.dir, "hosts"), Target: "/etc/hosts", ReadOnly: true})
	}
	termPath := c.spec.TerminationMessagePath
	if termPath == "" {
		termPath = corev1.TerminationMessagePathDefault
	}
	c.mu.Lock()
	hostFile := filepath.Join(c.dir, fmt.Sprintf("termination-log-%d", c.runs+1))
	c.mu.Unlock()
	if err := os.WriteFile(hostFile, nil, 0o666); err != nil {
		return nil, "", err
	}
	_ = os.Chmod(hostFile, 0o666)
	mounts = append(mounts, sandboxMount{Source: hostFile, Target: termPath})
	spec.Mounts = mounts
	if sc := c.spec.SecurityContext; sc != nil && sc.ReadOnlyRootFilesystem != nil {
		spec.ReadOnlyRoot = *sc.ReadOnlyRootFilesystem
	}
	return spec, hostFile, nil
}

// user sets the uid and gids: the container's securityContext, then the
// pod's, then the image's USER (numeric only).
func (c *container) user(img *image, spec *sandboxSpec) error {
	var uid, gid int64
	if u := img.config.User; u != "" && u != "root" {
		us, gs, hasGroup := strings.Cut(u, ":")
		var err error
		if uid, err = strconv.ParseInt(us, 10, 32); err != nil {
			return fmt.Errorf("image %s: user %q is not numeric (the pod runner does not read /etc/passwd)", c.spec.Image, u)
		}
		if hasGroup {
			if gid, err = strconv.ParseInt(gs, 10, 32); err != nil {
				return fmt.Errorf("image %s: group in user %q is not numeric", c.spec.Image, u)
			}
		}
	}
	var nonRoot *bool
	pod := c.pod.obj.Spec.SecurityContext
	if pod != nil {
		if pod.RunAsUser != nil {
			uid = *pod.RunAsUser
		}
		if pod.RunAsGroup != nil {
			gid = *pod.RunAsGroup
		}
		nonRoot = pod.RunAsNonRoot
		for _, g := range pod.SupplementalGroups {
			spec.Groups = append(spec.Groups, int(g))
		}
		if pod.FSGroup != nil {
			spec.Groups = append(spec.Groups, int(*pod.FSGroup))
		}
	}
	if sc := c.spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
	}
	if nonRoot != nil && *nonRoot && uid == 0 {
		return configError{fmt.Errorf("container has runAsNonRoot and image will run as root")}
	}
	spec.UID, spec.GID = uint32(uid), uint32(gid)
	return nil
}
