package serviceview

import (
	"bufio"
	"errors"
	"io"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// The filters: a list or a watch of the API server read Service by Service
// (package service), each decided on (view.go, watch.go) and written to the
// CCM (emit.go). They read from an io.Reader and write to the writer they
// are handed; the HTTP layer (package proxy, services.go) runs them between
// the API server's answer and the client.

// FilterList copies a ServiceList with only the Services in the view, each
// without its class, and of its metadata only the resourceVersion.
func FilterList(media wire.Media, view View, in io.Reader, out *bufio.Writer) error {
	w := newListWriter(media, out)
	err := service.ReadList(media, in, view.Class, false, service.ListVisit{
		Begin: w.begin,
		Meta:  w.meta,
		Item: func(s *service.Service) error {
			if !view.Shows(s.Facts) {
				return nil
			}
			return w.item(s)
		},
	})
	if err != nil {
		return err
	}
	return w.end()
}

// FilterWatch sends, for every event of the API server, what the watch's
// state decides, until the API server or the decision ends the watch.
func FilterWatch(media wire.Media, state *WatchState, in io.Reader, out *bufio.Writer) error {
	events, w := service.NewEventReader(media, in, state.view.Class), newEventWriter(media, out)
	for {
		ev, err := events.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		s, err := state.decide(ev)
		if err != nil {
			return err
		}
		if err := w.write(s); err != nil || s.last {
			return err
		}
	}
}
