package console

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// watched holds the objects of one kind in the console's namespace (all
// namespaces for "") as an informer of the API server keeps them: one
// list, then one watch, as kubectl get --watch would, never polled. Every
// change closes changed, which the pages' event streams wait on.
type watched struct {
	informer cache.SharedIndexInformer

	mu      sync.Mutex
	changed chan struct{}
	err     error // the last list or watch error (a refusal of RBAC, say), nil once it lists again
}

// init makes w's informer of the objects newList lists (of type obj);
// seen, if not nil, sees each object added, updated or deleted before the
// streams are told.
func (w *watched) init(c client.WithWatch, namespace string, newList func() client.ObjectList, obj runtime.Object, seen func(obj any, deleted bool)) {
	w.changed = make(chan struct{})
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list := newList()
			err := c.List(ctx, list, client.InNamespace(namespace), &client.ListOptions{Raw: &opts})
			w.setErr(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, newList(), client.InNamespace(namespace), &client.ListOptions{Raw: &opts})
		},
	}
	if seen == nil {
		seen = func(any, bool) {}
	}
	w.informer = cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
	_ = w.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) { w.setErr(err) })
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { seen(obj, false); w.notify() },
		UpdateFunc: func(_, obj any) { seen(obj, false); w.notify() },
		DeleteFunc: func(obj any) { seen(obj, true); w.notify() },
	})
}

func (w *watched) setErr(err error) {
	w.mu.Lock()
	changed := errText(w.err) != errText(err)
	w.err = err
	w.mu.Unlock()
	if changed {
		w.notify()
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (w *watched) notify() {
	w.mu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// next is closed at the next change, and the error of the last list or
// watch.
func (w *watched) next() (<-chan struct{}, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed, w.err
}

// objects are the objects of type T the informer holds.
func objects[T any](w *watched) []*T {
	var out []*T
	for _, obj := range w.informer.GetStore().List() {
		if o, ok := obj.(*T); ok {
			out = append(out, o)
		}
	}
	return out
}

// object is object ns/name as the informer holds it (nil: it has none).
func object[T any](w *watched, ns, name string) *T {
	obj, ok, err := w.informer.GetStore().GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil
	}
	o, _ := obj.(*T)
	return o
}

// ready waits until the informer has listed once (nil), its list failed
// (its error) or ctx ended.
func (w *watched) ready(ctx context.Context) error {
	tick := time.NewTicker(100 * time.Millisecond) // the informer's own state, not the API server, as cache.WaitForCacheSync polls it
	defer tick.Stop()
	for !w.informer.HasSynced() {
		if _, err := w.next(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// catchUp is how long a page's stream waits for the watch to hold the
// object the page was just rendered from.
const catchUp = 10 * time.Second

// awaitObject is object ns/name once the watch holds it, nil if it does
// not within catchUp: a page opened right after its object was created (the
// run a retry created, say) asks before the watch's event of it arrived.
func awaitObject[T any](ctx context.Context, w *watched, ns, name string) *T {
	deadline := time.NewTimer(catchUp)
	defer deadline.Stop()
	for {
		changed, _ := w.next()
		if o := object[T](w, ns, name); o != nil {
			return o
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}
