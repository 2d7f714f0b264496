// Package nodechurn creates and deletes Nodes from several goroutines at once,
// as a cluster does while machines come and go, and keeps track of which
// exist, for tests of controllers that must stay consistent under churn.
package nodechurn

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Options shape the churn.
type Options struct {
	// Workers is the number of goroutines creating and deleting (default 4).
	Workers int
	// MaxLive bounds the nodes that exist at once.
	MaxLive int
	// Prefix of node names: <Prefix><n>.
	Prefix string
	// NewNode returns the Node to create under name.
	NewNode func(name string) *corev1.Node
	// Pause after each create or delete (0: none).
	Pause time.Duration
	// Seed of the workers' random choices (each worker adds its index).
	Seed uint64
}

// Churn is a running churn.
type Churn struct {
	cs      kubernetes.Interface
	o       Options
	created atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup

	mu   sync.Mutex
	live map[string]bool
	err  error
}

// Start starts the workers: while fewer than MaxLive nodes exist, each creates
// one with probability 0.6 (always when none exist), otherwise deletes one.
func Start(cs kubernetes.Interface, o Options) *Churn {
	if o.Workers == 0 {
		o.Workers = 4
	}
	c := &Churn{cs: cs, o: o, stop: make(chan struct{}), live: map[string]bool{}}
	for i := range o.Workers {
		c.wg.Add(1)
		go c.work(o.Seed + uint64(i) + 1)
	}
	return c
}

func (c *Churn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

func (c *Churn) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

func (c *Churn) work(seed uint64) {
	defer c.wg.Done()
	r := rand.New(rand.NewPCG(seed, seed))
	ctx := context.Background()
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		c.mu.Lock()
		n := len(c.live)
		var victim string
		for name := range c.live {
			victim = name
			break
		}
		c.mu.Unlock()
		if n < c.o.MaxLive && (n == 0 || r.IntN(10) < 6) {
			name := c.o.Prefix + strconv.FormatInt(c.created.Add(1), 10)
			if _, err := c.cs.CoreV1().Nodes().Create(ctx, c.o.NewNode(name), metav1.CreateOptions{}); err != nil {
				c.fail(fmt.Errorf("create %s: %w", name, err))
				return
			}
			c.mu.Lock()
			c.live[name] = true
			c.mu.Unlock()
		} else {
			c.mu.Lock()
			if !c.live[victim] {
				c.mu.Unlock()
				continue
			}
			delete(c.live, victim)
			c.mu.Unlock()
			if err := c.cs.CoreV1().Nodes().Delete(ctx, victim, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				c.fail(fmt.Errorf("delete %s: %w", victim, err))
				return
			}
		}
		if c.o.Pause > 0 {
			time.Sleep(c.o.Pause)
		}
	}
}

// Created is the number of nodes created so far.
func (c *Churn) Created() int64 { return c.created.Load() }

// WaitCreated waits until n nodes have been created; an error if a worker
// failed first.
func (c *Churn) WaitCreated(n int64) error {
	for c.created.Load() < n {
		if c.failed() {
			return c.Err()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c.Err()
}

// Live returns the names of the nodes that exist now.
func (c *Churn) Live() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.live))
	for name := range c.live {
		out = append(out, name)
	}
	return out
}

// Err is the first failure of a worker.
func (c *Churn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Stop stops the workers, waits for them and returns the live nodes.
func (c *Churn) Stop() ([]string, error) {
	select {
	case <-c.stop:
		return nil, errors.New("nodechurn: stopped twice")
	default:
	}
	close(c.stop)
	c.wg.Wait()
	return c.Live(), c.Err()
}
