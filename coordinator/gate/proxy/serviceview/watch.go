package serviceview

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
)

// sendKind is what a watch sends its client for one event of the API server.
type sendKind int

const (
	// sendNothing: the event is about a Service the client does not see
	// and does not hold.
	sendNothing sendKind = iota
	// sendService: the event's Service, which is in the view, without its
	// class, as an event of type typ.
	sendService
	// sendTombstone: a DELETED for a Service the client holds and that left
	// the view, carrying only what the client saw of it: its namespace, name
	// and uid, and the resourceVersion of the event.
	sendTombstone
	// sendBookmark: a BOOKMARK carrying only its resourceVersion and the
	// initial-events-end annotation.
	sendBookmark
	// sendStatus: an ERROR carrying status (its code, reason and message).
	sendStatus
)

// send is a decision: what the client gets for one event.
type send struct {
	kind sendKind
	typ  string
	// svc is the Service of sendService.
	svc *service.Service
	// meta holds the few fields of a tombstone or bookmark.
	meta service.Facts
	// status is sendStatus's.
	status metav1.Status
	// last: the watch ends after this (the view cannot go on).
	last bool
}

// WatchState decides, event by event, what one watch sends its client: it
// follows which Services the client holds, so that a Service that leaves the
// view is DELETED for the client, one that enters it ADDED, and nothing about
// a Service outside the view reaches the client unless the client holds it,
// and then only its tombstone.
type WatchState struct {
	view View
	// complete: the watch starts with the whole state (sendInitialEvents,
	// or no sendInitialEvents and resourceVersion "" or "0"), so the client
	// holds exactly what this watch has sent it. Otherwise it continues what
	// the client holds from before (a resumed watch, or sendInitialEvents
	// false): on the first event about a Service the history says whether
	// the Service was in the view just before.
	complete bool
	history  *History
	// holds are the Services the client holds, by key: the uid of the one
	// it holds.
	holds map[string]string
	// decided are the Services of a continuing watch that the client does
	// not hold (a complete watch needs no record of them).
	decided map[string]struct{}
	// ended: the view ended the watch (it could not tell what the client
	// holds).
	Ended bool
}

// NewWatchState starts the state of a watch with the query q.
func NewWatchState(view View, history *History, q url.Values) *WatchState {
	_, initialSet := q["sendInitialEvents"]
	rv := q.Get("resourceVersion")
	return &WatchState{
		view:     view,
		history:  history,
		complete: QueryBool(q, "sendInitialEvents") || (!initialSet && (rv == "" || rv == "0")),
		holds:    map[string]string{},
		decided:  map[string]struct{}{},
	}
}

// decide maps one event of the API server to what the client gets.
func (w *WatchState) decide(ev service.WatchEvent) (send, error) {
	switch ev.Type {
	case service.EventBookmark:
		return send{kind: sendBookmark, typ: service.EventBookmark, meta: service.Facts{
			ResourceVersion: ev.Service.ResourceVersion, InitialEventsEnd: ev.Service.InitialEventsEnd}}, nil
	case service.EventError:
		return send{kind: sendStatus, typ: service.EventError, status: metav1.Status{
			Status: metav1.StatusFailure, Code: ev.Status.Code, Reason: ev.Status.Reason, Message: ev.Status.Message}}, nil
	case service.EventAdded, service.EventModified, service.EventDeleted:
	default:
		return send{}, fmt.Errorf("watch event of type %q", ev.Type)
	}
	svc := ev.Service
	key := svc.Key()
	uid, held := w.holds[key]
	_, notHeld := w.decided[key]
	known := held || notHeld || w.complete

	if w.view.Shows(svc.Facts) {
		if ev.Type == service.EventDeleted {
			w.forget(key)
			if known && !held {
				return send{}, nil
			}
			return send{kind: sendService, typ: service.EventDeleted, svc: svc}, nil
		}
		w.holds[key] = svc.UID
		delete(w.decided, key)
		typ := ev.Type
		if known && !held {
			typ = service.EventAdded // it entered the view
		}
		return send{kind: sendService, typ: typ, svc: svc}, nil
	}

	// Outside the view: the client may learn only that a Service it holds
	// is gone.
	if !known {
		var in, ok bool
		if in, uid, ok = w.heldBefore(key, svc.ResourceVersion); !ok {
			w.Ended = true
			return send{kind: sendStatus, typ: service.EventError, last: true, status: metav1.Status{
				Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired,
				Message: "ccm-gate: the view cannot tell what this watch's client holds from before its resourceVersion; list again",
			}}, nil
		}
		held = in
	}
	w.forget(key)
	if !held {
		return send{}, nil
	}
	return send{kind: sendTombstone, typ: service.EventDeleted, meta: service.Facts{
		Namespace: svc.Namespace, Name: svc.Name, UID: uid, ResourceVersion: svc.ResourceVersion}}, nil
}

// heldBefore says whether the client of a continuing watch holds the
// Service key on the watch's first event about it, at resourceVersion rv:
// it does when the Service was in the view just before. ok is false when
// that cannot be told.
func (w *WatchState) heldBefore(key, rv string) (held bool, uid string, ok bool) {
	if w.view.ShowsNone {
		return false, "", true // no Service is ever in the view
	}
	at, valid := parseResourceVersion(rv)
	if !valid || w.history == nil {
		return false, "", false
	}
	return w.history.inViewBefore(key, at)
}

// forget records that the client does not hold the Service key.
func (w *WatchState) forget(key string) {
	delete(w.holds, key)
	if !w.complete {
		w.decided[key] = struct{}{}
	}
}

// QueryBool reads a boolean query parameter as the API server does: absent,
// "0" or "false" is false, anything else (even empty) true.
func QueryBool(q url.Values, k string) bool {
	v, ok := q[k]
	if !ok || len(v) == 0 {
		return false
	}
	return v[0] != "0" && !strings.EqualFold(v[0], "false")
}
